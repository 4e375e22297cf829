//! The safe wrapper against an independent float64 reference of the update in shardadam.h,
//! plus its errors and ownership rules.
mod common;

use common::{assert_close, expect_error, shard_rows, Hyper, Reference, Rng};
use shardadam::{
    bf16_to_f32, f32_to_bf16, DType, GroupConfig, Layout, LoadOptions, Master, Optimizer,
    ParamOptions, Placement, StatePlacement, Status, StepArgs,
};

#[test]
fn status_names_match_the_library() {
    let names = [
        (Status::InvalidArgument, "SA_ERR_INVALID_ARGUMENT"),
        (Status::Unsupported, "SA_ERR_UNSUPPORTED"),
        (Status::OutOfMemory, "SA_ERR_OUT_OF_MEMORY"),
        (Status::Device, "SA_ERR_DEVICE"),
        (Status::Comm, "SA_ERR_COMM"),
        (Status::Io, "SA_ERR_IO"),
        (Status::Format, "SA_ERR_FORMAT"),
        (Status::Mismatch, "SA_ERR_MISMATCH"),
        (Status::State, "SA_ERR_STATE"),
        (Status::Internal, "SA_ERR_INTERNAL"),
    ];
    for (status, name) in names {
        assert_eq!(status.name(), name);
        assert_eq!(Status::from_code(status.code()), Some(status));
    }
    assert_eq!(Status::from_code(0), None);
    assert!(shardadam::build_info().starts_with("shardadam "));
    assert!(shardadam::version() >= 100);
}

#[test]
fn local_box_follows_torch_chunk() {
    // 10 rows over 4 ranks: 3, 3, 3, 1. 2 rows over 4 ranks: 1, 1, 0, 0 (offset 2).
    for (rows, coord, want_rows, want_offset) in
        [(10, 0, 3, 0), (10, 3, 1, 9), (2, 1, 1, 1), (2, 3, 0, 2)]
    {
        let (local, offset) = shard_rows([rows, 4], 4, coord).local_box().unwrap();
        assert_eq!(
            (local, offset),
            (vec![want_rows, 4], vec![want_offset, 0]),
            "{} rows, coord {}",
            rows,
            coord
        );
    }
}

/// Two groups (AdamW; Adam with L2, amsgrad and maximize), dense, mesh-sharded, box and
/// empty shards, five steps of random grads with an LR change: params and states follow
/// the float64 reference.
#[test]
fn adam_steps_match_float64_reference() {
    let mut rng = Rng(7);
    let mut opt = Optimizer::new(None).unwrap();
    let mut groups = [
        Hyper {
            lr: 1e-2,
            ..Hyper::ADAMW
        },
        Hyper {
            lr: 5e-3,
            beta1: 0.8,
            beta2: 0.99,
            eps: 1e-6,
            weight_decay: 0.1,
            decoupled_weight_decay: false,
            bias_correction: true,
            maximize: true,
            amsgrad: true,
        },
    ];
    // Group 0 names only lr (the rest are the library's defaults); group 1 names them all.
    opt.add_group(&GroupConfig::new().set("lr", groups[0].lr))
        .unwrap();
    opt.add_group(&groups[1].config()).unwrap();
    let specs: Vec<(&str, usize, Vec<i64>, Option<Layout>)> = vec![
        ("dense.w", 0, vec![3, 5], None),
        ("rows.w", 0, vec![1, 4], Some(shard_rows([10, 4], 4, 3))),
        (
            "box.w",
            1,
            vec![3, 5],
            Some(Layout::Box {
                global_shape: vec![7, 9],
                global_offset: vec![2, 4],
            }),
        ),
        ("empty.w", 1, vec![0, 3], Some(shard_rows([2, 3], 4, 3))),
        ("bias", 1, vec![7], None),
    ];
    let mut params = Vec::new();
    let mut refs = Vec::new();
    for (name, group, shape, layout) in &specs {
        let init = rng.values(shape.iter().product::<i64>() as usize);
        let options = ParamOptions {
            layout: layout.clone(),
            ..ParamOptions::default()
        };
        let p = opt
            .add_param(name, *group, shape, init.clone(), Some(&options))
            .unwrap();
        assert_eq!(p.index(), params.len() as i64);
        assert_eq!(opt.param_name(p).unwrap(), *name);
        params.push(p);
        refs.push(Reference::new(&init));
    }

    let steps = 5;
    for step in 1..=steps {
        if step == 3 {
            groups[0].lr = 3e-3;
            opt.set_lr(0, groups[0].lr).unwrap();
        }
        for (i, &p) in params.iter().enumerate() {
            let n = refs[i].p.len();
            if n == 0 {
                continue; // an empty shard needs no grad
            }
            let grad = rng.values(n);
            opt.set_grad(p, &grad).unwrap();
            refs[i].step(&grad, &groups[specs[i].1], step, 1.0);
        }
        opt.step().unwrap();
        for (i, &p) in params.iter().enumerate() {
            assert_close(
                &format!("step {}: {}", step, specs[i].0),
                opt.param_f32(p).unwrap(),
                &refs[i].p,
            );
        }
    }
    for (i, &p) in params.iter().enumerate() {
        assert_close(
            &format!("{}/exp_avg", specs[i].0),
            &opt.state(p, "exp_avg").unwrap(),
            &refs[i].m,
        );
        assert_close(
            &format!("{}/exp_avg_sq", specs[i].0),
            &opt.state(p, "exp_avg_sq").unwrap(),
            &refs[i].v,
        );
        if specs[i].1 == 1 {
            let vmax = opt.state(p, "max_exp_avg_sq").unwrap();
            assert_close(
                &format!("{}/max_exp_avg_sq", specs[i].0),
                &vmax,
                &refs[i].vmax,
            );
        }
    }
    for (g, hp) in groups.iter().enumerate() {
        assert_eq!(opt.step_count(g).unwrap(), steps as i64);
        hp.assert_matches(&format!("group {}", g), &opt.group(g).unwrap());
    }
}

/// bfloat16 params with float32 master weights and bfloat16 grads: the master follows the
/// reference and the param is the master rounded to bfloat16.
#[test]
fn bf16_param_follows_its_master_weights() {
    let mut rng = Rng(11);
    let mut opt = Optimizer::new(None).unwrap();
    let hp = Hyper {
        lr: 1e-2,
        ..Hyper::ADAMW
    };
    opt.add_group(&hp.config()).unwrap();
    let n = 33;
    let init: Vec<u16> = (0..n).map(|_| f32_to_bf16(rng.value())).collect();
    let wide: Vec<f32> = init.iter().map(|&b| bf16_to_f32(b)).collect();
    let p = opt
        .add_param16("emb.w", 0, DType::BFloat16, &[n as i64], init, None)
        .unwrap();
    let mut reference = Reference::new(&wide);
    for step in 1..=4 {
        let grad: Vec<u16> = (0..n).map(|_| f32_to_bf16(rng.value())).collect();
        let grad_wide: Vec<f32> = grad.iter().map(|&b| bf16_to_f32(b)).collect();
        opt.set_grad16(p, DType::BFloat16, &grad).unwrap();
        opt.step().unwrap();
        reference.step(&grad_wide, &hp, step, 1.0);
    }
    let master = opt.state(p, "master").unwrap();
    assert_close("master", &master, &reference.p);
    for (i, &bits) in opt.param_bits16(p).unwrap().iter().enumerate() {
        assert_eq!(
            bits,
            f32_to_bf16(master[i]),
            "param[{}] is not its master rounded to bfloat16",
            i
        );
    }
}

/// A bfloat16 param with an int16 remainder: param bits << 16 plus the remainder is the
/// float32 value, which follows the reference.
#[test]
fn remainder_restores_the_f32_value() {
    let mut rng = Rng(5);
    let mut opt = Optimizer::new(None).unwrap();
    let hp = Hyper {
        lr: 1e-2,
        ..Hyper::ADAMW
    };
    opt.add_group(&hp.config()).unwrap();
    let n = 17;
    let init: Vec<u16> = (0..n).map(|_| f32_to_bf16(rng.value())).collect();
    let wide: Vec<f32> = init.iter().map(|&b| bf16_to_f32(b)).collect();
    let options = ParamOptions {
        master: Master::Remainder,
        ..ParamOptions::default()
    };
    let p = opt
        .add_param16("w", 0, DType::BFloat16, &[n as i64], init, Some(&options))
        .unwrap();
    let mut reference = Reference::new(&wide);
    for step in 1..=3 {
        let grad: Vec<u16> = (0..n).map(|_| f32_to_bf16(rng.value())).collect();
        let grad_wide: Vec<f32> = grad.iter().map(|&b| bf16_to_f32(b)).collect();
        opt.set_grad16(p, DType::BFloat16, &grad).unwrap();
        opt.step().unwrap();
        reference.step(&grad_wide, &hp, step, 1.0);
    }
    let remainder = opt.state_i16(p, "remainder").unwrap();
    let joined: Vec<f32> = opt
        .param_bits16(p)
        .unwrap()
        .iter()
        .zip(&remainder)
        .map(|(&hi, &rem)| f32::from_bits(((hi as u32) << 16).wrapping_add(rem as i32 as u32)))
        .collect();
    assert_close("param:remainder", &joined, &reference.p);
    expect_error(
        "state(remainder)",
        opt.state(p, "remainder"),
        Status::Unsupported,
        &["state_i16"],
    );
}

/// Each placement's `sa_state_placement` value (shardadam.h's: 0, 1, 2), both ways.
#[test]
fn state_placement_codes() {
    let codes = [
        (StatePlacement::Device, shardadam_sys::SA_STATE_ON_DEVICE, 0),
        (StatePlacement::Host, shardadam_sys::SA_STATE_ON_HOST, 1),
        (
            StatePlacement::HostCpuStep,
            shardadam_sys::SA_STATE_ON_HOST_CPU_STEP,
            2,
        ),
    ];
    for (placement, constant, value) in codes {
        assert_eq!(constant, value, "{:?}", placement);
        assert_eq!(placement.code(), value, "{:?}", placement);
        assert_eq!(StatePlacement::from_code(value), Some(placement));
    }
}

/// A CPU param's state is host memory already: `StatePlacement::Host` and
/// `StatePlacement::HostCpuStep` are accepted, the param info reports `Device`, and the
/// steps give the same bits as the default placement.
#[test]
fn host_state_placement_of_a_cpu_param_resolves_to_device() {
    assert_eq!(StatePlacement::default(), StatePlacement::Device);
    for placement in [
        StatePlacement::Device,
        StatePlacement::Host,
        StatePlacement::HostCpuStep,
    ] {
        assert_eq!(StatePlacement::from_code(placement.code()), Some(placement));
    }
    assert_eq!(StatePlacement::from_code(5), None);

    let mut rng = Rng(13);
    let mut opt = Optimizer::new(None).unwrap();
    let hp = Hyper {
        lr: 1e-2,
        ..Hyper::ADAMW
    };
    opt.add_group(&hp.config()).unwrap();
    let n = 23;
    let init = rng.values(n);
    let default = opt
        .add_param("default", 0, &[n as i64], init.clone(), None)
        .unwrap();
    let placed: Vec<_> = [StatePlacement::Host, StatePlacement::HostCpuStep]
        .iter()
        .map(|&placement| {
            let options = ParamOptions {
                state_placement: placement,
                ..ParamOptions::default()
            };
            let name = format!("{:?}", placement);
            let p = opt
                .add_param(&name, 0, &[n as i64], init.clone(), Some(&options))
                .unwrap();
            (placement, p)
        })
        .collect();
    for p in std::iter::once(default).chain(placed.iter().map(|&(_, p)| p)) {
        assert_eq!(
            opt.param_state_placement(p).unwrap(),
            StatePlacement::Device,
            "{}",
            opt.param_name(p).unwrap()
        );
    }
    for _ in 0..3 {
        let grad = rng.values(n);
        opt.set_grad(default, &grad).unwrap();
        for &(_, p) in &placed {
            opt.set_grad(p, &grad).unwrap();
        }
        opt.step().unwrap();
    }
    let bits = |p| -> Vec<u32> {
        opt.param_f32(p)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    for (i, (after, before)) in bits(default).iter().zip(&init).enumerate() {
        assert_ne!(*after, before.to_bits(), "element {} did not change", i);
    }
    for &(placement, p) in &placed {
        assert_eq!(bits(p), bits(default), "{:?}", placement);
    }
}

#[test]
fn loss_scale_and_found_inf() {
    let mut opt = Optimizer::new(None).unwrap();
    let hp = Hyper::ADAMW;
    opt.add_group(&hp.config()).unwrap();
    let init = vec![1.0f32, -2.0, 3.0, 0.5];
    let p = opt.add_param("w", 0, &[4], init.clone(), None).unwrap();
    let grad = [8.0f32, 4.0, -2.0, 0.0];
    opt.set_grad(p, &grad).unwrap();

    assert!(
        opt.step_with(&StepArgs {
            found_inf: Some(true),
            ..StepArgs::default()
        })
        .unwrap()
        .skipped
    );
    assert_eq!(
        opt.param_f32(p).unwrap(),
        &init[..],
        "a skipped step changed the param"
    );
    assert_eq!(opt.step_count(0).unwrap(), 0);

    let report = opt
        .step_with(&StepArgs {
            inv_grad_scale: Some(0.25),
            found_inf: Some(false),
            ..StepArgs::default()
        })
        .unwrap();
    assert!(!report.skipped);
    assert_eq!(report.grad_norm, None, "no norm was asked for");
    let mut reference = Reference::new(&init);
    reference.step(&grad, &hp, 1, 0.25);
    assert_close(
        "after a scaled step",
        opt.param_f32(p).unwrap(),
        &reference.p,
    );
}

#[test]
fn errors_carry_status_and_a_message_naming_the_param() {
    let mut opt = Optimizer::new(None).unwrap();
    expect_error(
        "add_group(beta1 1.5)",
        opt.add_group(&GroupConfig::new().set("beta1", 1.5)),
        Status::InvalidArgument,
        &["beta1"],
    );
    opt.add_group(&GroupConfig::new()).unwrap();
    let bf16_grads = ParamOptions {
        grad_dtype: Some(DType::BFloat16),
        ..ParamOptions::default()
    };
    let w = opt
        .add_param("layers.0.w", 0, &[2, 3], vec![0.0; 6], Some(&bf16_grads))
        .unwrap();

    expect_error(
        "set_grad(f32 into bf16)",
        opt.set_grad(w, &[0.0; 6]),
        Status::Mismatch,
        &["layers.0.w", "bfloat16"],
    );
    expect_error(
        "step without a grad",
        opt.step(),
        Status::State,
        &["layers.0.w"],
    );
    expect_error(
        "add_param(duplicate name)",
        opt.add_param("layers.0.w", 0, &[1], vec![0.0], None),
        Status::InvalidArgument,
        &["layers.0.w"],
    );
    let off_layout = ParamOptions {
        layout: Some(shard_rows([10, 4], 4, 0)),
        ..ParamOptions::default()
    };
    let e = opt
        .add_param("layers.1.w", 0, &[2, 4], vec![0.0; 8], Some(&off_layout))
        .unwrap_err();
    assert!(
        e.message.contains("layers.1.w"),
        "shape off its layout: {}",
        e
    );
    expect_error(
        "add_param(3 values for 4)",
        opt.add_param("layers.2.w", 0, &[2, 2], vec![0.0; 3], None),
        Status::InvalidArgument,
        &["layers.2.w"],
    );
    expect_error(
        "state(no_such_state)",
        opt.state(w, "no_such_state"),
        Status::InvalidArgument,
        &["no_such_state"],
    );
    expect_error(
        "local_box(coord 9 of 2)",
        shard_rows([4, 4], 2, 9).local_box(),
        Status::InvalidArgument,
        &["9"],
    );

    // A param of another optimizer is refused, not misused.
    let mut other = Optimizer::new(None).unwrap();
    expect_error(
        "foreign param",
        other.set_grad(w, &[0.0; 6]),
        Status::InvalidArgument,
        &["another optimizer"],
    );

    // Nothing was half-added: the optimizer still works.
    assert_eq!(opt.step_count(0).unwrap(), 0);
    opt.set_grad16(w, DType::BFloat16, &[0; 6]).unwrap();
    opt.step().unwrap();
    assert_eq!(opt.step_count(0).unwrap(), 1);
}

#[test]
fn an_optimizer_moves_to_another_thread() {
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&GroupConfig::new()).unwrap();
    let p = opt.add_param("w", 0, &[2], vec![1.0, 1.0], None).unwrap();
    let handle = std::thread::spawn(move || {
        opt.set_grad(p, &[1.0, -1.0]).unwrap();
        opt.step().unwrap();
        opt
    });
    let opt = handle.join().unwrap();
    let w = opt.param_f32(p).unwrap();
    assert!(w[0] < 1.0 && w[1] > 1.0, "{:?}", w);
}

/// A fresh directory under the system's temporary directory, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("shardadam-rust-{}-{}", tag, std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two ranks, each holding half the rows of "w" and a replica of "bias", save after three
/// steps; one rank holding the whole tensors loads both files: its states are the ranks'
/// states put together, and the groups' step counts and hyperparameters come back.
#[test]
fn save_on_two_ranks_load_on_one() {
    let mut rng = Rng(3);
    let dir = TempDir::new("reshard");
    let hp = GroupConfig::new().set("lr", 1e-2);
    let mut saved: std::collections::BTreeMap<String, Vec<f32>> = Default::default();
    let mut paths = Vec::new();
    for r in 0..2i64 {
        let mut opt = Optimizer::new(None).unwrap();
        opt.add_group(&hp).unwrap();
        let rows = shard_rows([5, 3], 2, r);
        let (local, _) = rows.local_box().unwrap();
        let numel = (local[0] * local[1]) as usize;
        let w_options = ParamOptions {
            layout: Some(rows),
            ..ParamOptions::default()
        };
        let w = opt
            .add_param("w", 0, &local, rng.values(numel), Some(&w_options))
            .unwrap();
        let replicated = Layout::Mesh {
            global_shape: vec![4],
            mesh_shape: vec![2],
            mesh_coord: vec![r],
            placements: vec![Placement::Replicate],
        };
        let bias_options = ParamOptions {
            layout: Some(replicated),
            ..ParamOptions::default()
        };
        let bias = opt
            .add_param("bias", 0, &[4], rng.values(4), Some(&bias_options))
            .unwrap();
        for _ in 0..3 {
            opt.set_grad(w, &rng.values(numel)).unwrap();
            opt.set_grad(bias, &rng.values(4)).unwrap();
            opt.step().unwrap();
        }
        for key in ["exp_avg", "exp_avg_sq"] {
            let state = opt.state(w, key).unwrap();
            saved.entry(format!("w/{}", key)).or_default().extend(state); // rank 0's rows first
            if r == 0 {
                saved.insert(format!("bias/{}", key), opt.state(bias, key).unwrap());
            }
        }
        let path = dir.0.join(format!("rank{}.safetensors", r));
        opt.save(&path).unwrap();
        paths.push(path);
    }

    let mut whole = Optimizer::new(None).unwrap();
    whole
        .add_group(&hp.clone().set("lr", 0.5).set("beta2", 0.95))
        .unwrap();
    let w = whole
        .add_param("w", 0, &[5, 3], vec![0.0; 15], None)
        .unwrap();
    let bias = whole
        .add_param("bias", 0, &[4], vec![0.0; 4], None)
        .unwrap();

    // Rank 0's file alone leaves rows 3 and 4 uncovered: refused, and nothing changes.
    expect_error(
        "load(rank 0 only)",
        whole.load(&paths[..1], &LoadOptions::default()),
        Status::Mismatch,
        &["'w'"],
    );
    assert_eq!(whole.state(w, "exp_avg").unwrap(), vec![0.0; 15]);
    expect_error(
        "load(missing file)",
        whole.load(
            &[dir.0.join("missing.safetensors")],
            &LoadOptions::default(),
        ),
        Status::Io,
        &["missing.safetensors"],
    );

    whole.load(&paths, &LoadOptions::default()).unwrap();
    for (name, p) in [("w", w), ("bias", bias)] {
        for key in ["exp_avg", "exp_avg_sq"] {
            assert_eq!(
                whole.state(p, key).unwrap(),
                saved[&format!("{}/{}", name, key)],
                "{}/{}",
                name,
                key
            );
        }
    }
    assert_eq!(whole.step_count(0).unwrap(), 3);
    let restored = whole.group(0).unwrap();
    assert_eq!(restored.get("lr"), Some(1e-2));
    assert_eq!(
        restored.get("beta2"),
        Some(0.999),
        "the saved beta2, the default"
    );
}

/// An optimizer with a group at lr 1e-2, a [1024, 256] weight and a [4] bias, after two
/// steps of random grads (so every state is nonzero). The weight's state is large enough
/// (2 MiB for both moments) that a write takes a while.
fn stepped_optimizer(rng: &mut Rng) -> (Optimizer, [shardadam::Param; 2]) {
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&GroupConfig::new().set("lr", 1e-2)).unwrap();
    let w = opt
        .add_param("w", 0, &[1024, 256], rng.values(1024 * 256), None)
        .unwrap();
    let b = opt.add_param("b", 0, &[4], rng.values(4), None).unwrap();
    for _ in 0..2 {
        step_once(&mut opt, [w, b], rng);
    }
    (opt, [w, b])
}

fn step_once(opt: &mut Optimizer, params: [shardadam::Param; 2], rng: &mut Rng) {
    opt.set_grad(params[0], &rng.values(1024 * 256)).unwrap();
    opt.set_grad(params[1], &rng.values(4)).unwrap();
    opt.step().unwrap();
}

/// Every moment of every param, by "<param>/<key>".
fn moments(
    opt: &mut Optimizer,
    params: [shardadam::Param; 2],
) -> std::collections::BTreeMap<String, Vec<f32>> {
    let mut out = std::collections::BTreeMap::new();
    for (name, p) in [("w", params[0]), ("b", params[1])] {
        for key in ["exp_avg", "exp_avg_sq"] {
            out.insert(format!("{}/{}", name, key), opt.state(p, key).unwrap());
        }
    }
    out
}

/// The names in a directory, sorted (a temporary file left behind shows here).
fn file_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// save_async writes the state of its call: steps made before the wait change the state,
/// not the file, which is byte for byte what a synchronous save wrote just before, and
/// loads back the pre-step state. A second save waits for the job in flight.
#[test]
fn save_async_writes_the_state_at_the_call() {
    let mut rng = Rng(11);
    let dir = TempDir::new("save-async");
    let (mut opt, params) = stepped_optimizer(&mut rng);
    let before = moments(&mut opt, params);
    let sync_path = dir.0.join("sync.safetensors");
    let async_path = dir.0.join("async.safetensors");
    opt.save(&sync_path).unwrap();

    let mut job = opt.save_async(&async_path).unwrap();
    assert_eq!(job.path(), async_path.as_path());
    step_once(&mut opt, params, &mut rng); // while the job may still be writing
    let after = moments(&mut opt, params);
    assert_ne!(after, before, "the step changed the state");
    assert_eq!(opt.step_count(0).unwrap(), 3);
    job.wait().unwrap();
    job.wait().unwrap(); // again: the same result, at once
    assert!(job.is_done().unwrap());
    drop(job);

    let sync_bytes = std::fs::read(&sync_path).unwrap();
    assert!(
        sync_bytes.len() > 2 * 4 * 1024 * 256,
        "{} bytes",
        sync_bytes.len()
    );
    assert!(
        std::fs::read(&async_path).unwrap() == sync_bytes,
        "the async file differs from the synchronous save of the same state"
    );
    assert_eq!(
        file_names(&dir.0),
        ["async.safetensors", "sync.safetensors"],
        "no temporary file is left"
    );

    // Loading it takes the optimizer back to the state of the save_async call.
    opt.load(&[&async_path], &LoadOptions::default()).unwrap();
    assert!(
        moments(&mut opt, params) == before,
        "the loaded state is the pre-step one"
    );
    assert_eq!(opt.step_count(0).unwrap(), 2);
    assert_eq!(opt.param_steps(0, 2).unwrap(), vec![2, 2]);

    // One export writes at a time: a second save_async, or a save, first waits for the
    // job in flight, so that job has ended when either returns.
    let mut first = opt.save_async(dir.0.join("first.safetensors")).unwrap();
    let mut second = opt.save_async(dir.0.join("second.safetensors")).unwrap();
    assert!(
        first.is_done().unwrap(),
        "the second save_async waited for the first"
    );
    opt.save(dir.0.join("third.safetensors")).unwrap();
    assert!(
        second.is_done().unwrap(),
        "save waited for the job in flight"
    );
    first.wait().unwrap();
    second.wait().unwrap();
    for name in ["first", "second", "third"] {
        let bytes = std::fs::read(dir.0.join(format!("{}.safetensors", name))).unwrap();
        assert!(bytes == sync_bytes, "{}.safetensors differs", name);
    }
}

/// A path whose directory does not exist fails at once, with an I/O error naming it, and
/// nothing is started or left behind; the optimizer saves fine afterwards.
#[test]
fn save_async_to_a_missing_directory_is_an_io_error() {
    let mut rng = Rng(12);
    let dir = TempDir::new("save-async-missing");
    let (opt, _) = stepped_optimizer(&mut rng);
    expect_error(
        "save_async(missing directory)",
        opt.save_async(dir.0.join("no-such-dir").join("x.safetensors")),
        Status::Io,
        &["no-such-dir", "x.safetensors"],
    );
    assert!(file_names(&dir.0).is_empty(), "{:?}", file_names(&dir.0));
    opt.save_async(dir.0.join("x.safetensors"))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(file_names(&dir.0), ["x.safetensors"]);
}

/// Dropping a job without waiting waits for it: the file is complete when the drop
/// returns (dropped at once, while the job is writing: its writes and syncs take far longer
/// than the drop takes to come). A job also outlives its optimizer (dropping the optimizer
/// waits for it), and may be waited on from another thread.
#[test]
fn dropping_an_export_job_leaves_a_complete_file() {
    let mut rng = Rng(13);
    let dir = TempDir::new("save-async-drop");
    let (mut opt, params) = stepped_optimizer(&mut rng);
    let sync_path = dir.0.join("sync.safetensors");
    opt.save(&sync_path).unwrap();
    let sync_bytes = std::fs::read(&sync_path).unwrap();

    let dropped_path = dir.0.join("dropped.safetensors");
    drop(opt.save_async(&dropped_path).unwrap());
    let dropped = std::fs::read(&dropped_path).unwrap(); // there once the drop returned
    assert!(
        dropped == sync_bytes,
        "the dropped job's file is not the saved state"
    );

    // After a step, a job that outlives its optimizer, waited on by another thread.
    step_once(&mut opt, params, &mut rng);
    let orphan_path = dir.0.join("orphan.safetensors");
    let mut job = opt.save_async(&orphan_path).unwrap();
    let expected = moments(&mut opt, params);
    drop(opt);
    std::thread::spawn(move || job.wait())
        .join()
        .unwrap()
        .unwrap();
    let mut restored = Optimizer::new(None).unwrap();
    restored
        .add_group(&GroupConfig::new().set("lr", 1e-2))
        .unwrap();
    let w = restored
        .add_param("w", 0, &[1024, 256], vec![0.0; 1024 * 256], None)
        .unwrap();
    let b = restored
        .add_param("b", 0, &[4], vec![0.0; 4], None)
        .unwrap();
    restored
        .load(&[&orphan_path], &LoadOptions::default())
        .unwrap();
    assert!(moments(&mut restored, [w, b]) == expected);
    assert_eq!(restored.step_count(0).unwrap(), 3);
    assert_eq!(
        file_names(&dir.0),
        [
            "dropped.safetensors",
            "orphan.safetensors",
            "sync.safetensors"
        ]
    );
}
