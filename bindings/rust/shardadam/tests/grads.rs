//! Grad bindings and per-param step counts through the safe wrapper: every binding is
//! checked by the library and all-or-nothing, a param without a grad is skipped bit for bit
//! without advancing its count, per-param counts drive bias correction, and partial steps
//! (`step_params`) step their params only. References: the independent float64 update of
//! tests/common.
mod common;

use common::{assert_close, expect_error, Hyper, Reference, Rng};
use shardadam::{Grad, GroupConfig, Optimizer, Param, Status, StepArgs};

/// Three float32 params of one AdamW group ("emb" [5, 4], "w" [7], "b" [3]) and their
/// float64 references.
struct Trio {
    opt: Optimizer,
    hp: Hyper,
    params: Vec<Param>,
    refs: Vec<Reference>,
    rng: Rng,
}

const NAMES: [&str; 3] = ["emb", "w", "b"];

impl Trio {
    fn new() -> Trio {
        let mut rng = Rng(29);
        let mut opt = Optimizer::new(None).unwrap();
        // The other fields keep the library's defaults, which the reference takes from torch.
        opt.add_group(&GroupConfig::new().set("lr", 1e-2)).unwrap();
        let hp = Hyper {
            lr: 1e-2,
            ..Hyper::ADAMW
        };
        let mut params = Vec::new();
        let mut refs = Vec::new();
        for (name, shape) in NAMES.iter().zip([vec![5i64, 4], vec![7], vec![3]]) {
            let init = rng.values(shape.iter().product::<i64>() as usize);
            params.push(opt.add_param(name, 0, &shape, init.clone(), None).unwrap());
            refs.push(Reference::new(&init));
        }
        Trio {
            opt,
            hp,
            params,
            refs,
            rng,
        }
    }

    fn fresh_grads(&mut self) -> Vec<Vec<f32>> {
        let sizes: Vec<usize> = self.refs.iter().map(|r| r.p.len()).collect();
        sizes.into_iter().map(|n| self.rng.values(n)).collect()
    }

    /// Param i's values and moments: an untouched param keeps them bit for bit.
    fn snapshot(&mut self, i: usize) -> Vec<u32> {
        let p = self.params[i];
        let mut out: Vec<u32> = self
            .opt
            .param_f32(p)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        for key in ["exp_avg", "exp_avg_sq"] {
            out.extend(self.opt.state(p, key).unwrap().iter().map(|x| x.to_bits()));
        }
        out
    }

    fn check_against_reference(&self, what: &str) {
        for (i, &p) in self.params.iter().enumerate() {
            assert_close(
                &format!("{}: {}", what, NAMES[i]),
                self.opt.param_f32(p).unwrap(),
                &self.refs[i].p,
            );
        }
    }
}

/// A bfloat16 grad for a float32 param, a grad of the wrong length and a list of the wrong
/// length are refused, naming the param; nothing is bound by a refused call (the step
/// still finds no grad), and once grads are bound a refused call leaves them, buffers
/// included, as they were.
#[test]
fn set_grads_is_checked_and_all_or_nothing() {
    let mut f = Trio::new();
    let g = f.fresh_grads();
    let wrong_dtype = vec![0u16; 7];
    let decoy = f.rng.values(7);
    expect_error(
        "set_grads(bf16 grad for a float32 param)",
        f.opt.set_grads(&[
            Some(Grad::F32(&g[0])),
            Some(Grad::BFloat16(&wrong_dtype)),
            None,
        ]),
        Status::Mismatch,
        &["sa_optimizer_set_grads", "param 'w'", "bfloat16"],
    );
    expect_error(
        "set_grads(2 values for 3)",
        f.opt
            .set_grads(&[Some((&g[0]).into()), None, Some(Grad::F32(&g[2][..2]))]),
        Status::InvalidArgument,
        &["param 'b'", "2 values", "needs 3"],
    );
    expect_error(
        "set_grads(2 entries for 3 params)",
        f.opt.set_grads(&[Some((&g[0]).into()), None]),
        Status::InvalidArgument,
        &["n is 2 but the optimizer has 3 params"],
    );
    // Not even the None of the refused calls took effect.
    expect_error(
        "step after refused bindings",
        f.opt.step(),
        Status::State,
        &["param 'emb' was never given a grad"],
    );

    f.opt
        .set_grads(&[
            Some((&g[0]).into()),
            Some((&g[1]).into()),
            Some((&g[2]).into()),
        ])
        .unwrap();
    expect_error(
        "set_grads(fresh w, bf16 b)",
        f.opt.set_grads(&[
            Some((&g[0]).into()),
            Some((&decoy).into()),
            Some(Grad::BFloat16(&[0; 3])),
        ]),
        Status::Mismatch,
        &["param 'b'"],
    );
    f.opt.step().unwrap();
    for (reference, grad) in f.refs.iter_mut().zip(&g) {
        reference.step(grad, &f.hp, 1, 1.0);
    }
    f.check_against_reference("the grads bound before the refused call");
    assert_eq!(f.opt.param_steps(0, 3).unwrap(), vec![1, 1, 1]);
}

/// Over four steps, params without a grad (a None of set_grads, clear_grad) keep their
/// values and moments bit for bit and their counts; the others follow the reference at
/// their own counts.
#[test]
fn a_param_without_a_grad_is_skipped_and_keeps_its_count() {
    let mut f = Trio::new();
    let present = [
        [true, false, true],
        [false, true, true],
        [true, true, false],
        [true, true, true],
    ];
    let mut counts = [0i64; 3];
    for (step, has) in present.iter().enumerate() {
        let g = f.fresh_grads();
        if step % 2 == 0 {
            let grads: Vec<Option<Grad>> = (0..3)
                .map(|i| if has[i] { Some((&g[i]).into()) } else { None })
                .collect();
            f.opt.set_grads(&grads).unwrap();
        } else {
            for i in 0..3 {
                let p = f.params[i];
                if has[i] {
                    f.opt.set_grad(p, &g[i]).unwrap();
                } else {
                    f.opt.clear_grad(p).unwrap();
                }
            }
        }
        let before: Vec<Vec<u32>> = (0..3).map(|i| f.snapshot(i)).collect();
        f.opt.step().unwrap();
        for i in 0..3 {
            if has[i] {
                counts[i] += 1;
                f.refs[i].step(&g[i], &f.hp, counts[i] as i32, 1.0);
            } else {
                assert_eq!(
                    f.snapshot(i),
                    before[i],
                    "step {}: {} had no grad but changed",
                    step,
                    NAMES[i]
                );
            }
        }
        f.check_against_reference(&format!("step {}", step));
        assert_eq!(
            f.opt.param_steps(0, 3).unwrap(),
            counts.to_vec(),
            "step {}",
            step
        );
    }
    assert_eq!(counts, [3, 3, 3]);
    assert_eq!(
        f.opt.step_count(0).unwrap(),
        4,
        "the group counts the optimizer's steps"
    );
}

/// Counts [6, 6, 3] set through the wrapper give each param torch's bias correction at its
/// own count (t = 7, 7, 4: lr / (1 - beta1^t) differs by 1.5x between 4 and 7); bad counts
/// and ranges are refused and change nothing; a group's count sets its params' counts.
#[test]
fn per_param_steps_drive_bias_correction() {
    let mut f = Trio::new();
    f.opt.set_param_steps(0, &[6, 6, 3]).unwrap();
    assert_eq!(f.opt.param_steps(1, 2).unwrap(), vec![6, 3]);
    let g = f.fresh_grads();
    for (&p, grad) in f.params.iter().zip(&g) {
        f.opt.set_grad(p, grad).unwrap();
    }
    f.opt.step().unwrap();
    for (i, t) in [7, 7, 4].iter().enumerate() {
        f.refs[i].step(&g[i], &f.hp, *t, 1.0);
    }
    f.check_against_reference("after steps [6, 6, 3]");
    assert_eq!(f.opt.param_steps(0, 3).unwrap(), vec![7, 7, 4]);

    expect_error(
        "set_param_steps(-2)",
        f.opt.set_param_steps(1, &[4, -2]),
        Status::InvalidArgument,
        &["param 'b'", "-2"],
    );
    expect_error(
        "param_steps(2..4)",
        f.opt.param_steps(2, 2),
        Status::InvalidArgument,
        &["not a range of params"],
    );
    assert_eq!(f.opt.param_steps(0, 3).unwrap(), vec![7, 7, 4]);
    f.opt.set_step_count(0, 10).unwrap();
    assert_eq!(f.opt.param_steps(0, 3).unwrap(), vec![10, 10, 10]);
}

/// Partial steps over {emb, b} and then {w} leave every param, moments included, with the
/// bits one full step over the same grads gives, and the same per-param counts; only the
/// full step advances the group's count.
#[test]
fn partial_steps_over_every_param_give_a_full_steps_bits() {
    let mut partial = Trio::new();
    let mut full = Trio::new();
    let g = partial.fresh_grads();
    for f in [&mut partial, &mut full] {
        for (&p, grad) in f.params.iter().zip(&g) {
            f.opt.set_grad(p, grad).unwrap();
        }
    }
    let (emb, w, b) = (partial.params[0], partial.params[1], partial.params[2]);
    partial.opt.step_params(&[emb, b]).unwrap();
    assert_eq!(partial.opt.param_steps(0, 3).unwrap(), vec![1, 0, 1]);
    let report = partial
        .opt
        .step_params_with(&[w], &StepArgs::default())
        .unwrap();
    assert!(!report.skipped);
    assert_eq!(report.grad_norm, None);
    full.opt.step().unwrap();
    for (i, name) in NAMES.iter().enumerate() {
        assert_eq!(
            partial.snapshot(i),
            full.snapshot(i),
            "{}: partial steps differ from the full step",
            name
        );
    }
    assert_eq!(partial.opt.param_steps(0, 3).unwrap(), vec![1, 1, 1]);
    assert_eq!(full.opt.param_steps(0, 3).unwrap(), vec![1, 1, 1]);
    assert_eq!(
        partial.opt.step_count(0).unwrap(),
        0,
        "partial steps leave the group's count"
    );
    assert_eq!(full.opt.step_count(0).unwrap(), 1);
    for (reference, grad) in full.refs.iter_mut().zip(&g) {
        reference.step(grad, &full.hp, 1, 1.0);
    }
    full.check_against_reference("the full step");
}

/// A param left out of a partial step keeps its value and moments bit for bit and its
/// count, with a grad bound or never given one; the listed ones (in any order) follow the
/// reference, also with a loss scale. A listed param never given a grad is refused.
#[test]
fn a_param_left_out_of_a_partial_step_stays_as_it_is() {
    let mut f = Trio::new();
    let g = f.fresh_grads();
    let (emb, w, b) = (f.params[0], f.params[1], f.params[2]);
    f.opt.set_grad(emb, &g[0]).unwrap();
    f.opt.set_grad(w, &g[1]).unwrap();
    expect_error(
        "step_params(b never given a grad)",
        f.opt.step_params(&[emb, b]),
        Status::State,
        &["param 'b' was never given a grad"],
    );
    let before = f.snapshot(2);
    let args = StepArgs {
        inv_grad_scale: Some(0.5),
        ..Default::default()
    };
    f.opt.step_params_with(&[w, emb], &args).unwrap();
    assert_eq!(f.snapshot(2), before, "b was not listed but changed");
    for i in 0..2 {
        f.refs[i].step(&g[i], &f.hp, 1, 0.5);
        assert_close(
            &format!("listed: {}", NAMES[i]),
            f.opt.param_f32(f.params[i]).unwrap(),
            &f.refs[i].p,
        );
    }
    assert_eq!(f.opt.param_steps(0, 3).unwrap(), vec![1, 1, 0]);

    // A found-inf flag skips the partial step: nothing changes, no count advances.
    let before: Vec<Vec<u32>> = (0..3).map(|i| f.snapshot(i)).collect();
    let args = StepArgs {
        found_inf: Some(true),
        ..Default::default()
    };
    assert!(f.opt.step_params_with(&[emb], &args).unwrap().skipped);
    assert_eq!((0..3).map(|i| f.snapshot(i)).collect::<Vec<_>>(), before);
    assert_eq!(f.opt.param_steps(0, 3).unwrap(), vec![1, 1, 0]);
}

/// A param listed twice, clipping, and a param of another optimizer are refused, and
/// nothing changes: no value, moment or count.
#[test]
fn a_bad_partial_step_is_refused_and_changes_nothing() {
    let mut f = Trio::new();
    let g = f.fresh_grads();
    for (&p, grad) in f.params.iter().zip(&g) {
        f.opt.set_grad(p, grad).unwrap();
    }
    let (emb, w, b) = (f.params[0], f.params[1], f.params[2]);
    let before: Vec<Vec<u32>> = (0..3).map(|i| f.snapshot(i)).collect();
    expect_error(
        "step_params(emb, b, emb)",
        f.opt.step_params(&[emb, b, emb]),
        Status::InvalidArgument,
        &["params[2] is 0 again", "param 'emb'"],
    );
    let clip = StepArgs {
        max_grad_norm: Some(1.0),
        ..Default::default()
    };
    expect_error(
        "step_params_with(max_grad_norm)",
        f.opt.step_params_with(&[w], &clip),
        Status::InvalidArgument,
        &["in a partial step"],
    );
    let other = Trio::new();
    expect_error(
        "step_params(another optimizer's param)",
        f.opt.step_params(&[w, other.params[1]]),
        Status::InvalidArgument,
        &["another optimizer"],
    );
    assert_eq!((0..3).map(|i| f.snapshot(i)).collect::<Vec<_>>(), before);
    assert_eq!(f.opt.param_steps(0, 3).unwrap(), vec![0, 0, 0]);
    assert_eq!(f.opt.step_count(0).unwrap(), 0);
}
