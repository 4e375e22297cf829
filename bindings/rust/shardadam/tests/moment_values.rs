//! `Optimizer::moment_values` (`sa_optimizer_get_moment_values`): a moment as float32
//! values whatever its storage. The expected values come from the update formula of
//! shardadam.h and docs/precision.md's "8-bit moments", computed here in f32.
mod common;

use common::{expect_error, Rng};
use shardadam::{DType, GroupConfig, Optimizer, Param, ParamOptions, Status};

/// 8-bit moments keep a float32 absmax per 256 elements of the local shard.
const BLOCK: usize = 256;
/// More than one block, the last one partial.
const N: usize = 300;
/// A power of two, so (1 - beta1) * g is exact in f32 whatever precision the library
/// computes beta1 * 0 + (1 - beta1) * g in.
const BETA1: f32 = 0.5;

/// Seeded grads in [-1, 1) with one planted extreme per block, negative in the first block
/// and positive in the partial one. Planted apart from the rest: an element within a code
/// step of the extreme would share its code, and of a negative block's top code only the
/// first element reads -absmax (docs/precision.md: 8-bit moments).
fn grads() -> Vec<f32> {
    let mut g: Vec<f32> = Rng(7).values(N).iter().map(|x| x / 2.0).collect();
    g[100] = -1.75;
    g[290] = 1.5;
    g
}

/// An optimizer with one param "w" of N elements and the given moment dtype, stepped once
/// from zero moments with `grads()`.
fn stepped(moment_dtype: Option<DType>) -> (Optimizer, Param) {
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&GroupConfig::new().set("beta1", BETA1 as f64))
        .unwrap();
    let options = ParamOptions {
        moment_dtype,
        ..ParamOptions::default()
    };
    let w = opt
        .add_param("w", 0, &[N as i64], vec![0.25; N], Some(&options))
        .unwrap();
    opt.set_grad(w, &grads()).unwrap();
    opt.step().unwrap();
    (opt, w)
}

#[test]
fn eight_bit_exp_avg_reads_as_float32_values_near_the_step_with_each_blocks_absmax_exact() {
    let (mut opt, w) = stepped(Some(DType::Uint8));
    let values = opt.moment_values(w, "exp_avg").unwrap();
    // (a) one value per element, and the step's: none of the grads is zero.
    assert_eq!(values.len(), N);
    assert!(values.iter().any(|&x| x != 0.0));
    let expected: Vec<f32> = grads().iter().map(|g| (1.0 - BETA1) * g).collect();
    for (b, (block, want)) in values.chunks(BLOCK).zip(expected.chunks(BLOCK)).enumerate() {
        let (top, absmax) = want
            .iter()
            .enumerate()
            .map(|(i, x)| (i, x.abs()))
            .fold((0, 0.0f32), |best, e| if e.1 > best.1 { e } else { best });
        // (b) the block's absmax is kept exact: its largest element reads as it, signed.
        assert_eq!(
            block[top],
            absmax.copysign(want[top]),
            "block {}: element {}",
            b,
            top
        );
        // (c) every element within 1/64 of the absmax: the dynamic map's codes in the top
        // decade [0.1, 1] are 0.9/64 apart (bitsandbytes' create_dynamic_map), so the
        // nearest code is at most 0.9/128 of the absmax away, and nearer below 0.1.
        for (i, (got, want)) in block.iter().zip(want).enumerate() {
            assert!(
                (got - want).abs() <= absmax / 64.0,
                "block {}: element {}: {} vs {} (absmax {})",
                b,
                i,
                got,
                want,
                absmax
            );
        }
    }
}

#[test]
fn state_of_a_block_code_moment_points_to_moment_values() {
    for (dtype, what) in [
        (DType::Uint8, "uint8 codes"),
        (DType::Float8E4m3fn, "float8_e4m3fn codes"),
    ] {
        let (mut opt, w) = stepped(Some(dtype));
        // (d)
        expect_error(
            dtype.name(),
            opt.state(w, "exp_avg"),
            Status::Unsupported,
            &["'exp_avg'", "'w'", what, "moment_values"],
        );
        assert_eq!(opt.moment_values(w, "exp_avg_sq").unwrap().len(), N);
    }
}

#[test]
fn moment_values_of_float32_moments_are_state_bit_for_bit() {
    let (mut opt, w) = stepped(None);
    for key in ["exp_avg", "exp_avg_sq"] {
        let state = opt.state(w, key).unwrap();
        let values = opt.moment_values(w, key).unwrap();
        // (e) bits, so that -0.0 and NaN would count; the step made every one nonzero.
        assert!(state.iter().all(|&x| x != 0.0), "{}", key);
        assert_eq!(
            values.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            state.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{}",
            key
        );
    }
}
