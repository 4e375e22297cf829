//! fp8 params from Rust (`Optimizer::add_fp8_tensor`), against references written here
//! from the formats' and the scalings' definitions, never from the library's outputs: a
//! float8_e4m3fn value by its bit fields, the saturating round-to-nearest-even cast by
//! searching all 256 codes, the scales by shardadam.h's rules; the master against a
//! float32 param stepped on the same grads by a second optimizer. Refused options leave
//! nothing added, and every tensor handed over is dropped exactly once, whether the
//! library took it or not.
mod common;

use common::{expect_error, Rng};
use shardadam::{
    scalings, DType, GroupConfig, Optimizer, Param, ParamOptions, Scaling, Status, Tensor,
};
use shardadam_sys as sys;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

// ---- float8_e4m3fn, from its definition ----------------------------------------------

/// The largest finite float8_e4m3fn value: S.1111.110 = 1.75 * 2^8.
const E4M3FN_MAX: f64 = 448.0;

/// The value of a float8_e4m3fn code: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa
/// bits; exponent 0 is subnormal (m * 2^-9); S.1111.111 is NaN and there is no infinity.
fn e4m3fn_value(code: u8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> 3) & 0xf) as i32;
    let m = (code & 0x7) as i32;
    if e == 0xf && m == 0x7 {
        return f64::NAN;
    }
    if e == 0 {
        return sign * m as f64 * 2f64.powi(1 - 7 - 3);
    }
    sign * (8 + m) as f64 * 2f64.powi(e - 7 - 3)
}

/// The saturating cast to float8_e4m3fn, rounding to nearest with ties to the even code:
/// the nearest of all 256 codes (NaNs aside; a zero keeps the value's sign) to `x`
/// clamped to ±448.
fn e4m3fn_cast(x: f64) -> u8 {
    assert!(!x.is_nan(), "the reference is for numbers");
    let v = x.clamp(-E4M3FN_MAX, E4M3FN_MAX);
    let mut best: Option<(u8, f64)> = None;
    for code in 0..=255u8 {
        let value = e4m3fn_value(code);
        if value.is_nan() || (value == 0.0 && (code & 0x80 != 0) != v.is_sign_negative()) {
            continue;
        }
        let d = (value - v).abs();
        best = match best {
            Some((c, bd)) if d > bd || (d == bd && code & 1 != 0) => Some((c, bd)),
            _ => Some((code, d)),
        };
    }
    best.unwrap().0
}

#[test]
fn the_reference_cast_is_the_formats() {
    assert_eq!(e4m3fn_value(0x7e), 448.0);
    assert_eq!(e4m3fn_value(0xfe), -448.0);
    assert_eq!(e4m3fn_value(0x38), 1.0);
    assert_eq!(e4m3fn_value(0x01), 2f64.powi(-9)); // the smallest subnormal
    assert_eq!(e4m3fn_value(0x08), 2f64.powi(-6)); // the smallest normal
    assert!(e4m3fn_value(0x7f).is_nan() && e4m3fn_value(0xff).is_nan());
    assert_eq!(e4m3fn_cast(1.0e6), 0x7e); // saturates
    assert_eq!(e4m3fn_cast(-f64::INFINITY), 0xfe);
    assert_eq!(e4m3fn_cast(1.0625), 0x38); // halfway between 1 (0x38) and 1.125: even
    assert_eq!(e4m3fn_cast(1.1875), 0x3a); // halfway between 1.125 and 1.25 (0x3a): even
    assert_eq!(e4m3fn_cast(2f64.powi(-10)), 0x00); // halfway to the smallest subnormal
    assert_eq!(e4m3fn_cast(-1e-9), 0x80); // a negative zero
    for code in 0..=255u8 {
        if !e4m3fn_value(code).is_nan() {
            assert_eq!(e4m3fn_cast(e4m3fn_value(code)), code, "code {:#x}", code);
        }
    }
}

// ---- helpers ----------------------------------------------------------------------------

/// `n` float8_e4m3fn codes, every non-NaN code possible.
fn random_codes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| match (rng.next_u64() >> 56) as u8 {
            0x7f => 0x7e,
            0xff => 0xfe,
            code => code,
        })
        .collect()
}

fn e4m3(codes: Vec<u8>, shape: &[i64]) -> Tensor {
    Tensor::from_bits8(DType::Float8E4m3fn, codes, shape).unwrap()
}

fn f32s(values: &[f32]) -> Tensor {
    Tensor::from_f32(values.to_vec(), &[values.len() as i64]).unwrap()
}

fn options(scaling: Scaling, margin: i32) -> ParamOptions {
    ParamOptions {
        scaling,
        margin,
        ..ParamOptions::default()
    }
}

fn group() -> GroupConfig {
    GroupConfig::new().set("lr", 1e-2).set("weight_decay", 0.05)
}

fn max_abs(values: &[f32]) -> f32 {
    values.iter().fold(0.0f32, |top, m| top.max(m.abs()))
}

fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{}", what);
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    assert!(
        bad.is_empty(),
        "{}: {} values differ, the first at {}: {} (want {})",
        what,
        bad.len(),
        bad[0],
        got[bad[0]],
        want[bad[0]]
    );
}

fn assert_codes(what: &str, got: &[u8], want: impl Iterator<Item = u8>) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(*g, w, "{}: code {} is {:#04x}, want {:#04x}", what, i, g, w);
    }
}

/// A float32 param of `init` in an optimizer of its own, the twin an fp8 param's master
/// is stepped against.
fn twin(init: Vec<f32>, shape: &[i64]) -> (Optimizer, Param) {
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&group()).unwrap();
    let p = opt.add_param("w", 0, shape, init, None).unwrap();
    (opt, p)
}

// ---- the library's table ----------------------------------------------------------------

/// shardadam.h's sa_param_scaling, through the safe API: each variant's value is the
/// header's constant, and the table's names, blocks and scale dtypes are the header's.
#[test]
fn scalings_are_the_headers_table() {
    let expected = [
        (
            Scaling::None,
            sys::SA_SCALING_NONE,
            "none",
            0,
            DType::Float32,
            false,
        ),
        (
            Scaling::Delayed,
            sys::SA_SCALING_DELAYED,
            "delayed",
            0,
            DType::Float32,
            false,
        ),
        (
            Scaling::Mxfp8,
            sys::SA_SCALING_MXFP8,
            "mxfp8",
            32,
            DType::Float8E8m0fnu,
            true,
        ),
        (
            Scaling::Block128,
            sys::SA_SCALING_BLOCK128,
            "block128",
            128,
            DType::Float32,
            true,
        ),
        (
            Scaling::Current,
            sys::SA_SCALING_CURRENT,
            "current",
            0,
            DType::Float32,
            true,
        ),
        (
            Scaling::CurrentPow2,
            sys::SA_SCALING_CURRENT_POW2,
            "current_pow2",
            0,
            DType::Float32,
            true,
        ),
    ];
    let table = scalings();
    assert_eq!(table.len(), expected.len(), "{:?}", table);
    for (scaling, code, name, block, scale_dtype, writes) in expected {
        assert_eq!(scaling.code(), code, "{:?}", scaling);
        assert_eq!(Scaling::from_code(code), scaling);
        let info = table
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no scaling {}", name));
        assert_eq!(info.scaling, scaling, "{}", name);
        assert_eq!(info.block, block, "{}", name);
        assert_eq!(info.scale_dtype, Some(scale_dtype), "{}", name);
        assert_eq!(info.step_writes_scale, writes, "{}", name);
        assert!(!info.doc.is_empty(), "{} has no doc", name);
    }
    assert_eq!(Scaling::from_code(99), Scaling::Other(99));
    assert_eq!(Scaling::Other(99).code(), 99);
    assert_eq!(ParamOptions::default().scaling, Scaling::None);
}

#[test]
fn from_bits8_takes_8_bit_dtypes_only() {
    for dtype in [
        DType::Uint8,
        DType::Float8E4m3fn,
        DType::Float8E5m2,
        DType::Float8E8m0fnu,
    ] {
        let t = Tensor::from_bits8(dtype, vec![1, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
        assert_eq!(t.dtype(), Some(dtype));
        assert_eq!(t.as_bits8(), Some(&[1u8, 2, 3, 4, 5, 6][..]));
        assert_eq!(t.shape(), &[2, 3]);
    }
    expect_error(
        "from_bits8(float32)",
        Tensor::from_bits8(DType::Float32, vec![0; 4], &[1]),
        Status::InvalidArgument,
        &["not 8 bits wide"],
    );
    expect_error(
        "from_bits8(5 codes, [2, 3])",
        Tensor::from_bits8(DType::Float8E5m2, vec![0; 5], &[2, 3]),
        Status::InvalidArgument,
        &["5 values", "needs 6"],
    );
}

// ---- the scalings, stepped ----------------------------------------------------------------

/// A float8_e4m3fn param under delayed scaling (scale 16, read by every step; an amax
/// tensor): over three steps its master is a float32 twin's param bit for bit, its codes
/// the reference cast of master * 16, the amax max |master|, and the scale is not written.
#[test]
fn delayed_scaling_steps_the_master_and_casts_it_with_the_engines_scale() {
    const SCALE: f32 = 16.0;
    let shape = [4i64, 64];
    let n = 256;
    let mut rng = Rng(0xf8);
    let codes = random_codes(&mut rng, n);
    // fp8 value / scale: exact (a power of two), and up to 28, so master * 16 saturates.
    let init: Vec<f32> = codes
        .iter()
        .map(|&c| (e4m3fn_value(c) / SCALE as f64) as f32)
        .collect();

    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&group()).unwrap();
    let w = opt
        .add_fp8_tensor(
            "w",
            0,
            e4m3(codes.clone(), &shape),
            f32s(&[SCALE]),
            Some(f32s(&[-1.0])),
            &options(Scaling::Delayed, 0),
        )
        .unwrap();
    assert_eq!(opt.num_params(), 1);
    assert_eq!(opt.param_scaling(w).unwrap(), (Scaling::Delayed, 0));
    assert_eq!(opt.param_bits8(w).unwrap(), &codes[..]);
    assert_same_bits(
        "the initial master",
        &opt.state(w, "master").unwrap(),
        &init,
    );
    let (mut reference, q) = twin(init, &shape);

    for step in 1..=3 {
        let grad: Vec<f32> = rng.values(n).iter().map(|g| g * 3.0).collect();
        opt.set_grad(w, &grad).unwrap();
        reference.set_grad(q, &grad).unwrap();
        opt.step().unwrap();
        reference.step().unwrap();

        let master = opt.state(w, "master").unwrap();
        let what = format!("step {}", step);
        assert_same_bits(&what, &master, reference.param_f32(q).unwrap());
        assert_codes(
            &what,
            opt.param_bits8(w).unwrap(),
            master.iter().map(|&m| e4m3fn_cast((m * SCALE) as f64)),
        );
        let amax = opt.amax_tensor(w).unwrap().unwrap().as_f32().unwrap();
        assert_eq!(
            amax[0].to_bits(),
            max_abs(&master).to_bits(),
            "{}: amax",
            what
        );
        let scale = opt.scale_tensor(w).unwrap().unwrap().as_f32().unwrap();
        assert_eq!(scale, &[SCALE], "{}: the scale is read, not written", what);
    }
    assert!(
        opt.param_bits8(w)
            .unwrap()
            .iter()
            .any(|&c| c & 0x7f == 0x7e),
        "some master * 16 saturated"
    );
}

/// Current scaling with margin 2: every step writes [scale, scale_inv] with scale =
/// (448 / amax) / 2^2 in float32, amax = max |master| after the update, scale_inv =
/// 1 / scale, and casts master * scale. The codes given start the master at their value
/// times the scale_inv given.
#[test]
fn current_scaling_with_a_margin_writes_the_scale_from_the_amax() {
    const MARGIN: i32 = 2;
    let shape = [4i64, 64];
    let n = 256;
    let mut rng = Rng(0xc5);
    let codes = random_codes(&mut rng, n);
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&group()).unwrap();
    let w = opt
        .add_fp8_tensor(
            "w",
            0,
            e4m3(codes.clone(), &shape),
            f32s(&[4.0, 0.25]),
            Some(f32s(&[0.0])),
            &options(Scaling::Current, MARGIN),
        )
        .unwrap();
    assert_eq!(opt.param_scaling(w).unwrap(), (Scaling::Current, MARGIN));
    let init: Vec<f32> = codes
        .iter()
        .map(|&c| (e4m3fn_value(c) * 0.25) as f32)
        .collect();
    assert_same_bits(
        "the initial master",
        &opt.state(w, "master").unwrap(),
        &init,
    );

    for step in 1..=3 {
        let grad: Vec<f32> = rng.values(n).iter().map(|g| g * 3.0).collect();
        opt.set_grad(w, &grad).unwrap();
        opt.step().unwrap();
        let master = opt.state(w, "master").unwrap();
        let amax = max_abs(&master);
        let want = (E4M3FN_MAX as f32 / amax) / (1 << MARGIN) as f32;
        let what = format!("step {}", step);
        let scale = opt.scale_tensor(w).unwrap().unwrap().as_f32().unwrap();
        assert_eq!(
            (scale[0].to_bits(), scale[1].to_bits()),
            (want.to_bits(), (1.0 / want).to_bits()),
            "{}: scale {:?}, want [{}, {}] (448 / amax {} / 4)",
            what,
            scale,
            want,
            1.0 / want,
            amax
        );
        let got_amax = opt.amax_tensor(w).unwrap().unwrap().as_f32().unwrap()[0];
        assert_eq!(got_amax.to_bits(), amax.to_bits(), "{}: amax", what);
        assert_codes(
            &what,
            opt.param_bits8(w).unwrap(),
            master.iter().map(|&m| e4m3fn_cast((m * want) as f64)),
        );
    }
}

/// floor(log2 x) of a positive float32, exactly: the exponent field of x as a float64
/// (which holds float32 subnormals as normal numbers).
fn floor_log2(x: f32) -> i32 {
    assert!(x > 0.0 && x.is_finite());
    (((x as f64).to_bits() >> 52) & 0x7ff) as i32 - 1023
}

/// MXFP8 on a [2, 64] float8_e4m3fn param: each block of 32 along the last dim gets the
/// float8_e8m0fnu code 127 + floor(log2 amax) - 8 (emax 8 of e4m3; clamped to [0, 254];
/// 0 for a block of zeros), and its codes are the cast of master / 2^(code - 127). The
/// master starts as the codes' values times their block's scale and steps as a float32
/// twin's param.
#[test]
fn mxfp8_writes_a_power_of_two_scale_per_block_of_32() {
    let shape = [2i64, 64];
    let n = 128;
    let mut rng = Rng(0x3e);
    let mut codes = random_codes(&mut rng, n);
    codes[96..128].iter_mut().for_each(|c| *c = 0); // block 3: zeros, and zero grads
    let scale_codes = vec![120u8, 127, 131, 100];
    let init: Vec<f32> = (0..n)
        .map(|i| {
            let x = scale_codes[i / 32] as i32 - 127;
            (e4m3fn_value(codes[i]) * 2f64.powi(x)) as f32
        })
        .collect();
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&group()).unwrap();
    let scale = Tensor::from_bits8(DType::Float8E8m0fnu, scale_codes, &[2, 2]).unwrap();
    let w = opt
        .add_fp8_tensor(
            "w",
            0,
            e4m3(codes, &shape),
            scale,
            None,
            &options(Scaling::Mxfp8, 0),
        )
        .unwrap();
    assert_eq!(opt.param_scaling(w).unwrap(), (Scaling::Mxfp8, 0));
    assert!(opt.amax_tensor(w).unwrap().is_none());
    assert_same_bits(
        "the initial master",
        &opt.state(w, "master").unwrap(),
        &init,
    );
    let (mut reference, q) = twin(init, &shape);

    for step in 1..=3 {
        let mut grad: Vec<f32> = rng.values(n).iter().map(|g| g * 3.0).collect();
        grad[96..128].iter_mut().for_each(|g| *g = 0.0);
        opt.set_grad(w, &grad).unwrap();
        reference.set_grad(q, &grad).unwrap();
        opt.step().unwrap();
        reference.step().unwrap();
        let master = opt.state(w, "master").unwrap();
        let what = format!("step {}", step);
        assert_same_bits(&what, &master, reference.param_f32(q).unwrap());

        let scales = opt.scale_tensor(w).unwrap().unwrap().as_bits8().unwrap();
        let codes = opt.param_bits8(w).unwrap();
        for (b, block) in master.chunks(32).enumerate() {
            let amax = max_abs(block);
            let want = if amax == 0.0 {
                0
            } else {
                (127 + floor_log2(amax) - 8).clamp(0, 254)
            };
            assert_eq!(
                scales[b] as i32, want,
                "{}: block {} (amax {})",
                what, b, amax
            );
            let x = want - 127;
            assert_codes(
                &format!("{}, block {}", what, b),
                &codes[b * 32..(b + 1) * 32],
                block.iter().map(|&m| e4m3fn_cast(m as f64 * 2f64.powi(-x))),
            );
        }
        assert_eq!(scales[3], 0, "{}: the block of zeros", what);
    }
}

/// recast_params casts again from the master with the scale as it is now (a new delayed
/// scale written through scale_f32_mut), writing the amax; reset_masters starts the
/// master again from codes written through param_bits8_mut. A range past the params is
/// refused and changes nothing.
#[test]
fn recast_params_and_reset_masters_make_params_and_masters_agree() {
    let shape = [2i64, 32];
    let n = 64;
    let mut rng = Rng(0x5eed);
    let codes = random_codes(&mut rng, n);
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&group()).unwrap();
    let plain = opt
        .add_param("plain", 0, &[3], vec![1.0, 2.0, 3.0], None)
        .unwrap();
    let w = opt
        .add_fp8_tensor(
            "w",
            0,
            e4m3(codes, &shape),
            f32s(&[4.0]),
            Some(f32s(&[0.0])),
            &options(Scaling::Delayed, 0),
        )
        .unwrap();
    assert_eq!(opt.param_scaling(plain).unwrap(), (Scaling::None, 0));
    assert!(opt.scale_tensor(plain).unwrap().is_none());
    opt.set_grad(plain, &[0.1, 0.2, 0.3]).unwrap();
    opt.set_grad(w, &rng.values(n)).unwrap();
    opt.step().unwrap();
    let master = opt.state(w, "master").unwrap();

    opt.scale_f32_mut(w).unwrap()[0] = 8.0;
    let before = opt.param_bits8(w).unwrap().to_vec();
    expect_error(
        "recast_params past the params",
        opt.recast_params(1, 2),
        Status::InvalidArgument,
        &[],
    );
    assert_eq!(opt.param_bits8(w).unwrap(), &before[..], "a refused recast");
    opt.recast_params(0, 2).unwrap();
    assert_same_bits(
        "the master after a recast",
        &opt.state(w, "master").unwrap(),
        &master,
    );
    assert_codes(
        "recast with scale 8",
        opt.param_bits8(w).unwrap(),
        master.iter().map(|&m| e4m3fn_cast((m * 8.0) as f64)),
    );
    let amax = opt.amax_tensor(w).unwrap().unwrap().as_f32().unwrap()[0];
    assert_eq!(amax.to_bits(), max_abs(&master).to_bits());

    let loaded = random_codes(&mut rng, n);
    opt.param_bits8_mut(w).unwrap().copy_from_slice(&loaded);
    expect_error(
        "reset_masters past the params",
        opt.reset_masters(0, 3),
        Status::InvalidArgument,
        &[],
    );
    assert_same_bits("a refused reset", &opt.state(w, "master").unwrap(), &master);
    opt.reset_masters(1, 1).unwrap();
    let want: Vec<f32> = loaded
        .iter()
        .map(|&c| (e4m3fn_value(c) / 8.0) as f32)
        .collect();
    assert_same_bits(
        "the master after a reset",
        &opt.state(w, "master").unwrap(),
        &want,
    );
    assert_eq!(
        opt.param_bits8(w).unwrap(),
        &loaded[..],
        "a reset keeps the codes"
    );

    expect_error(
        "param_bits8 of a float32 param",
        opt.param_bits8(plain),
        Status::Mismatch,
        &["plain"],
    );
    expect_error(
        "scale_bits8_mut of a float32 scale",
        opt.scale_bits8_mut(w),
        Status::State,
        &["'w'"],
    );
}

// ---- refusals and ownership ----------------------------------------------------------------

/// A DLPack producer's tensor (DLPack >= 1.0, or the legacy struct) whose deleter counts
/// its calls on a counter of the test's own.
struct Produced {
    versioned: sys::DLManagedTensorVersioned,
    legacy: sys::DLManagedTensor,
    shape: Vec<i64>,
    words: Vec<u32>, // the bytes, 4-aligned (a float32 scale must be)
    deleted: Arc<AtomicUsize>,
}

unsafe extern "C" fn delete_versioned(m: *mut sys::DLManagedTensorVersioned) {
    let p = Box::from_raw((*m).manager_ctx as *mut Produced);
    p.deleted.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn delete_legacy(m: *mut sys::DLManagedTensor) {
    let p = Box::from_raw((*m).manager_ctx as *mut Produced);
    p.deleted.fetch_add(1, Ordering::SeqCst);
}

fn dlpack(dtype: DType) -> sys::DLDataType {
    shardadam::dtypes()
        .iter()
        .find(|d| d.name == dtype.name())
        .unwrap()
        .dtype
}

/// A producer's tensor of `dtype` and `shape` holding `bytes`, counted on `deleted`, and
/// the address of its data.
fn produce(
    dtype: DType,
    bytes: &[u8],
    shape: &[i64],
    legacy: bool,
    deleted: &Arc<AtomicUsize>,
) -> (Tensor, *const c_void) {
    let mut words = vec![0u32; (bytes.len() + 3) / 4];
    // SAFETY: words holds at least bytes.len() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr() as *mut u8, bytes.len())
    };
    let dl_tensor = sys::DLTensor {
        data: std::ptr::null_mut(),
        device: shardadam::Device::Cpu.raw(),
        ndim: shape.len() as i32,
        dtype: dlpack(dtype),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let p = Box::into_raw(Box::new(Produced {
        versioned: sys::DLManagedTensorVersioned {
            version: sys::DLPackVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor,
        },
        legacy: sys::DLManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        },
        shape: shape.to_vec(),
        words,
        deleted: Arc::clone(deleted),
    }));
    // SAFETY: p was just allocated; the tensor made of it is the one owner from now on.
    unsafe {
        let ctx = p as *mut c_void;
        let data = (*p).words.as_mut_ptr() as *mut c_void;
        let shape = (*p).shape.as_mut_ptr();
        for t in [&mut (*p).versioned.dl_tensor, &mut (*p).legacy.dl_tensor] {
            t.data = data;
            t.shape = shape;
        }
        (*p).versioned.manager_ctx = ctx;
        (*p).legacy.manager_ctx = ctx;
        let tensor = if legacy {
            Tensor::from_managed_legacy(&mut (*p).legacy)
        } else {
            Tensor::from_managed(&mut (*p).versioned)
        };
        (tensor.unwrap(), data)
    }
}

/// Counters of the param's, the scale's and the amax's deletions.
struct Counts {
    param: Arc<AtomicUsize>,
    scale: Arc<AtomicUsize>,
    amax: Arc<AtomicUsize>,
}

impl Counts {
    fn new() -> Counts {
        Counts {
            param: Arc::new(AtomicUsize::new(0)),
            scale: Arc::new(AtomicUsize::new(0)),
            amax: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn get(&self) -> [usize; 3] {
        [&self.param, &self.scale, &self.amax].map(|c| c.load(Ordering::SeqCst))
    }
}

/// Producers' tensors for a [4, 64] float8_e4m3fn param: its codes, a float32 scale of
/// `scale_len` elements (1.0 each) and a legacy producer's float32 amax.
fn produced_fp8(counts: &Counts, scale_len: usize) -> (Tensor, Tensor, Tensor) {
    let codes = vec![0x38u8; 256];
    let (param, _) = produce(DType::Float8E4m3fn, &codes, &[4, 64], false, &counts.param);
    let one: Vec<u8> = (0..scale_len).flat_map(|_| 1.0f32.to_ne_bytes()).collect();
    let (scale, _) = produce(
        DType::Float32,
        &one,
        &[scale_len as i64],
        false,
        &counts.scale,
    );
    let (amax, _) = produce(DType::Float32, &[0; 4], &[1], true, &counts.amax);
    (param, scale, amax)
}

/// An fp8 param without a scaling, a margin of 7, a scale of the wrong shape: each is
/// the library's error with its message, nothing is added, and each tensor given (the
/// param's, the scale's, a legacy producer's amax) is deleted once, now. An fp8 param the
/// library takes keeps them until the optimizer is dropped, which deletes each once.
#[test]
fn refused_fp8_params_add_nothing_and_drop_their_tensors_once() {
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&group()).unwrap();
    let refusals: [(&str, usize, ParamOptions, &[&str]); 4] = [
        (
            "no scaling",
            1,
            ParamOptions::default(),
            &["float8_e4m3fn param needs a scaling", "SA_SCALING_DELAYED"],
        ),
        (
            "margin 7",
            2,
            options(Scaling::Current, 7),
            &["options.margin is 7; it must be 0 to 6"],
        ),
        (
            "a delayed scale of two elements",
            2,
            options(Scaling::Delayed, 0),
            &["options.scale has shape", "hold one element"],
        ),
        (
            "a current scale of one element",
            1,
            options(Scaling::Current, 0),
            &["options.scale has shape", "must be"],
        ),
    ];
    for (what, scale_len, options, needles) in refusals.iter() {
        let counts = Counts::new();
        let (param, scale, amax) = produced_fp8(&counts, *scale_len);
        expect_error(
            what,
            opt.add_fp8_tensor("w", 0, param, scale, Some(amax), options),
            Status::InvalidArgument,
            needles,
        );
        assert_eq!(opt.num_params(), 0, "{}: nothing is added", what);
        assert_eq!(
            counts.get(),
            [1, 1, 1],
            "{}: each tensor deleted once",
            what
        );
    }

    // add_tensor has no scale to give: an fp8 param is refused for want of a scaling.
    let counts = Counts::new();
    let (param, _, _) = produced_fp8(&counts, 1);
    expect_error(
        "add_tensor of fp8 codes",
        opt.add_tensor("w", 0, param, None),
        Status::InvalidArgument,
        &["needs a scaling"],
    );
    assert_eq!(counts.get(), [1, 1, 1]);
    // Nor can it give the scale a scaling needs.
    let counts = Counts::new();
    let (param, _, _) = produced_fp8(&counts, 1);
    expect_error(
        "add_tensor with a scaling",
        opt.add_tensor("w", 0, param, Some(&options(Scaling::Delayed, 0))),
        Status::InvalidArgument,
        &["options.scale is NULL; SA_SCALING_DELAYED needs one"],
    );
    assert_eq!(counts.get(), [1, 1, 1]);

    // The same refusals of tensors that own Vecs: dropped by Rust, once (no double free).
    expect_error(
        "Vec tensors, margin 7",
        opt.add_fp8_tensor(
            "w",
            0,
            e4m3(vec![0x38; 256], &[4, 64]),
            f32s(&[1.0, 1.0]),
            Some(f32s(&[0.0])),
            &options(Scaling::Current, 7),
        ),
        Status::InvalidArgument,
        &["options.margin is 7"],
    );
    assert_eq!(opt.num_params(), 0);

    let counts = Counts::new();
    let (param, scale, amax) = produced_fp8(&counts, 1);
    let scale_data = scale.data_ptr();
    let amax_data = amax.data_ptr();
    let w = opt
        .add_fp8_tensor(
            "w",
            0,
            param,
            scale,
            Some(amax),
            &options(Scaling::Delayed, 0),
        )
        .unwrap();
    assert_eq!(opt.num_params(), 1);
    assert_eq!(counts.get(), [0, 0, 0], "the optimizer owns them");
    assert_eq!(opt.scale_tensor(w).unwrap().unwrap().data_ptr(), scale_data);
    assert_eq!(opt.amax_tensor(w).unwrap().unwrap().data_ptr(), amax_data);
    opt.set_grad(w, &[0.5; 256]).unwrap();
    opt.step().unwrap();
    let master = opt.state(w, "master").unwrap();
    // SAFETY: the producer's amax lives until the optimizer is dropped.
    let amax = unsafe { *(amax_data as *const f32) };
    assert_eq!(
        amax.to_bits(),
        max_abs(&master).to_bits(),
        "the step wrote the amax"
    );
    expect_error(
        "param_bits8 of a producer's param",
        opt.param_bits8(w),
        Status::Unsupported,
        &["'w'"],
    );
    expect_error(
        "scale_f32_mut of a producer's scale",
        opt.scale_f32_mut(w),
        Status::State,
        &["'w'"],
    );
    drop(opt);
    assert_eq!(counts.get(), [1, 1, 1], "deleted once, with the optimizer");
}
