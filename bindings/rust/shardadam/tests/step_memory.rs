//! `StepArgs`' addresses (`inv_grad_scale_at`, `found_inf_at`, `grad_norm_at`) on a CPU
//! optimizer, where the optimizer's memory is host memory: each step reads the loss scale
//! and the found-inf flag where they are at that step, and writes the norm there, against
//! the float64 reference.
mod common;

use common::{assert_close, assert_scale_matters, expect_error, Hyper, Reference, Rng};
use shardadam::{NormType, Optimizer, Param, Status, StepArgs};
use std::cell::Cell;

/// Adam with L2 weight decay: the decay joins the scaled grad, so the loss scale changes
/// the update. (Under AdamW a scale would barely show: m / sqrt(v) is the same for every
/// scale of the grads, up to eps.)
const L2: Hyper = Hyper {
    lr: 0.01,
    weight_decay: 0.5,
    decoupled_weight_decay: false,
    ..Hyper::ADAMW
};

/// A CPU optimizer with one group of `hp` and one param of 37 seeded values, its grad
/// bound; returns the param, its initial values and the grad.
fn one_param(hp: &Hyper, seed: u64) -> (Optimizer, Param, Vec<f32>, Vec<f32>) {
    let mut rng = Rng(seed);
    let init = rng.values(37);
    let grad = rng.values(37);
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&hp.config()).unwrap();
    let p = opt.add_param("w", 0, &[37], init.clone(), None).unwrap();
    opt.set_grad(p, &grad).unwrap();
    (opt, p, init, grad)
}

#[test]
fn a_nonzero_flag_at_found_inf_at_skips_the_step_and_a_zero_one_does_not() {
    let (mut opt, p, init, grad) = one_param(&L2, 1);
    let flag = Cell::new(1.0f32);
    // SAFETY: `flag` is host memory (a CPU optimizer's) and outlives both steps.
    let args = unsafe { StepArgs::default().found_inf_at(flag.as_ptr()) };

    let report = opt.step_with(&args).unwrap();
    assert!(report.skipped, "the flag at found_inf_at was 1");
    assert_eq!(
        opt.param_f32(p).unwrap(),
        &init[..],
        "a skipped step changed the param"
    );
    assert_eq!(opt.step_count(0).unwrap(), 0);
    assert_eq!(opt.param_steps(0, 1).unwrap(), vec![0]);

    flag.set(0.0); // the same args: the step reads the flag where it is, now
    let report = opt.step_with(&args).unwrap();
    assert!(!report.skipped, "the flag at found_inf_at was 0");
    let mut reference = Reference::new(&init);
    reference.step(&grad, &L2, 1, 1.0);
    assert_close(
        "after the unskipped step",
        opt.param_f32(p).unwrap(),
        &reference.p,
    );
    assert_eq!(opt.step_count(0).unwrap(), 1);
}

#[test]
fn each_step_multiplies_the_grads_by_the_f32_at_inv_grad_scale_at() {
    let (mut opt, p, init, grad) = one_param(&L2, 2);
    let scale = Cell::new(0.5f32);
    // SAFETY: `scale` is host memory (a CPU optimizer's) and outlives both steps.
    let args = unsafe { StepArgs::default().inv_grad_scale_at(scale.as_ptr()) };
    let mut reference = Reference::new(&init);

    // The test's power: with this group, an unscaled step lands far from a scaled one.
    assert_scale_matters(&init, &grad, &L2);
    reference.step(&grad, &L2, 1, 0.5);

    opt.step_with(&args).unwrap();
    assert_close(
        "after a step at scale 0.5",
        opt.param_f32(p).unwrap(),
        &reference.p,
    );

    scale.set(0.125); // read again at the second step
    opt.step_with(&args).unwrap();
    reference.step(&grad, &L2, 2, 0.125);
    assert_close(
        "after a step at scale 0.125",
        opt.param_f32(p).unwrap(),
        &reference.p,
    );
}

#[test]
fn the_step_writes_the_norm_of_the_scaled_grads_to_grad_norm_at() {
    for (norm_type, name) in [(NormType::L2, "L2"), (NormType::Inf, "inf")] {
        let (mut opt, _, _, grad) = one_param(&Hyper::ADAMW, 3);
        let scale = Cell::new(0.25f32);
        let norm = Cell::new(f32::NAN);
        let measure = StepArgs {
            max_grad_norm: Some(f64::INFINITY),
            norm_type,
            ..StepArgs::default()
        };
        // SAFETY: host memory of the test (a CPU optimizer's), live across the step; `norm`
        // is not touched until the step has returned.
        let args = unsafe {
            measure
                .inv_grad_scale_at(scale.as_ptr())
                .grad_norm_at(norm.as_ptr())
        };
        let report = opt.step_with(&args).unwrap();

        let scaled = grad.iter().map(|&g| g as f64 * 0.25);
        let want = match norm_type {
            NormType::L2 => scaled.map(|g| g * g).sum::<f64>().sqrt(),
            NormType::Inf => scaled.map(f64::abs).fold(0.0, f64::max),
        };
        let reported = report.grad_norm.expect("max_grad_norm asks for the norm");
        assert!(
            (reported - want).abs() <= 1e-12 * want,
            "{}: reported norm {} against {}",
            name,
            reported,
            want
        );
        assert!(
            (norm.get() as f64 - want).abs() <= 1e-6 * want,
            "{}: the f32 at grad_norm_at holds {} against {}",
            name,
            norm.get(),
            want
        );
    }
}

#[test]
fn an_address_without_its_use_or_beside_a_host_value_is_refused() {
    let (mut opt, p, init, _) = one_param(&L2, 4);
    let value = Cell::new(1.0f32);
    // SAFETY (all three): host memory of the test, live across each call; these steps are
    // refused before anything is read.
    let both_scales = unsafe {
        StepArgs {
            inv_grad_scale: Some(0.5),
            ..StepArgs::default()
        }
        .inv_grad_scale_at(value.as_ptr())
    };
    expect_error(
        "inv_grad_scale and inv_grad_scale_at",
        opt.step_with(&both_scales),
        Status::InvalidArgument,
        &["inv_grad_scale_at"],
    );
    let both_flags = unsafe {
        StepArgs {
            found_inf: Some(false),
            ..StepArgs::default()
        }
        .found_inf_at(value.as_ptr())
    };
    expect_error(
        "found_inf and found_inf_at",
        opt.step_with(&both_flags),
        Status::InvalidArgument,
        &["found_inf_at"],
    );
    // A norm output without a norm to compute: the library's own check.
    let no_norm = unsafe { StepArgs::default().grad_norm_at(value.as_ptr()) };
    expect_error(
        "grad_norm_at without max_grad_norm",
        opt.step_with(&no_norm),
        Status::InvalidArgument,
        &["max_grad_norm"],
    );
    assert_eq!(
        opt.param_f32(p).unwrap(),
        &init[..],
        "a refused step changed the param"
    );
    assert_eq!(value.get(), 1.0);
}
