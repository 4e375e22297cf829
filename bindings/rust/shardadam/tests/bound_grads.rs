//! Grad memory bound once (`bind_grad`, `bind_grads`): steps read it where it is, with no
//! copy and no rebinding, and match the independent float64 update of tests/common; every
//! binding is checked by the library, whose message reaches the caller; tensors from raw
//! pointers, DLPack structs and managed tensors live exactly as long as they are used.
mod common;

use common::{assert_close, expect_error, Hyper, Reference, Rng};
use shardadam::{DType, Device, GroupConfig, Optimizer, Param, Status, Tensor};
use std::os::raw::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

fn adamw(lr: f64) -> (Optimizer, Hyper) {
    let mut opt = Optimizer::new(None).unwrap();
    // The fields not named keep the library's defaults, which the reference takes from torch.
    opt.add_group(&GroupConfig::new().set("lr", lr)).unwrap();
    (opt, Hyper { lr, ..Hyper::ADAMW })
}

/// Three params, each of another kind of memory: a Vec moved in ("w" [5, 3]), host memory
/// the test owns behind a raw pointer ("b" [3]), and a borrowed DLTensor ("e" [0], an empty
/// shard). Their grads are bound once, each its own way, before six steps: "w"'s is a
/// Tensor::from_f32 written through grad_f32_mut, "b"'s raw host memory written by the
/// test. No step rebinds anything, and every step matches the reference.
#[test]
fn grads_bound_once_are_read_in_place_at_every_step() {
    let mut rng = Rng(41);
    let (mut opt, hp) = adamw(2e-2);
    let w_init = rng.values(15);
    let w = opt
        .add_param("w", 0, &[5, 3], w_init.clone(), None)
        .unwrap();

    let mut b_values = rng.values(3);
    let b_init = b_values.clone();
    let mut b_grad = vec![0.0f32; 3];
    let mut empty_shape = [0i64];
    let empty_dl = shardadam_sys::DLTensor {
        data: std::ptr::null_mut(),
        device: Device::Cpu.raw(),
        ndim: 1,
        dtype: shardadam::dtypes()
            .iter()
            .find(|d| d.name == "float32")
            .unwrap()
            .dtype,
        shape: empty_shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    // SAFETY: b_values, b_grad and the empty shard outlive `opt` (dropped at the end of the
    // test, before them: declared later), and nothing touches them during a step.
    let (b, e) = unsafe {
        let b_tensor = Tensor::from_raw_parts(
            b_values.as_mut_ptr() as *mut c_void,
            Device::Cpu,
            DType::Float32,
            &[3],
        )
        .unwrap();
        let b = opt.add_tensor("b", 0, b_tensor, None).unwrap();
        let e = opt
            .add_tensor("e", 0, Tensor::from_dl_tensor(&empty_dl).unwrap(), None)
            .unwrap();
        let b_grad_tensor = Tensor::from_raw_parts(
            b_grad.as_mut_ptr() as *mut c_void,
            Device::Cpu,
            DType::Float32,
            &[3],
        )
        .unwrap();
        opt.bind_grads(vec![
            Some(Tensor::from_f32(vec![0.0; 15], &[5, 3]).unwrap()),
            Some(b_grad_tensor),
            Some(Tensor::from_dl_tensor(&empty_dl).unwrap()),
        ])
        .unwrap();
        (b, e)
    };
    let grad_address = |opt: &Optimizer, p: Param| opt.grad_tensor(p).unwrap().unwrap().data_ptr();
    let bound = (grad_address(&opt, w), grad_address(&opt, b));
    assert_eq!(bound.1, b_grad.as_mut_ptr() as *mut c_void);

    let mut w_ref = Reference::new(&w_init);
    let mut b_ref = Reference::new(&b_init);
    for t in 1..=6 {
        let gw = rng.values(15);
        let gb = rng.values(3);
        opt.grad_f32_mut(w).unwrap().copy_from_slice(&gw);
        // The optimizer holds b_grad's address, not a borrow: write through it as the
        // contract allows (between steps), never through the Vec while `opt` may read it.
        unsafe { std::ptr::copy_nonoverlapping(gb.as_ptr(), bound.1 as *mut f32, 3) };
        opt.step().unwrap();
        w_ref.step(&gw, &hp, t, 1.0);
        b_ref.step(&gb, &hp, t, 1.0);
        assert_close(
            &format!("step {}: w", t),
            opt.param_f32(w).unwrap(),
            &w_ref.p,
        );
        assert_eq!(
            (grad_address(&opt, w), grad_address(&opt, b)),
            bound,
            "step {}: a grad was rebound",
            t
        );
    }
    assert_eq!(opt.param_steps(0, 3).unwrap(), vec![6, 6, 6]);
    let b_unowned = opt.param_f32(b).expect_err("b's memory is the test's");
    assert_eq!(b_unowned.status, Status::Unsupported, "{}", b_unowned);
    assert_eq!(opt.device(), Some(Device::Cpu));
    let _ = e;
    drop(opt);
    assert_close("b (the test's memory)", &b_values, &b_ref.p);
}

/// A wrong dtype, shape or device of a bound grad is refused by the library with its
/// message (which names the call, the param, what was expected and what came), and the
/// binding before it stays: the next step still reads the earlier buffer.
#[test]
fn a_bound_grad_of_the_wrong_dtype_shape_or_device_is_refused_by_the_library() {
    let mut rng = Rng(43);
    let (mut opt, hp) = adamw(1e-2);
    let init = rng.values(6);
    let w = opt
        .add_param("layers.0.w", 0, &[2, 3], init.clone(), None)
        .unwrap();
    opt.bind_grad(w, Tensor::from_f32(vec![0.0; 6], &[2, 3]).unwrap())
        .unwrap();
    let g = rng.values(6);
    opt.grad_f32_mut(w).unwrap().copy_from_slice(&g);

    expect_error(
        "bind_grad(bfloat16 for a float32 param)",
        opt.bind_grad(
            w,
            Tensor::from_bits16(DType::BFloat16, vec![0; 6], &[2, 3]).unwrap(),
        ),
        Status::Mismatch,
        &[
            "sa_optimizer_set_grad",
            "param 'layers.0.w'",
            "bfloat16",
            "float32",
        ],
    );
    expect_error(
        "bind_grad(shape [3, 2] for [2, 3])",
        opt.bind_grad(w, Tensor::from_f32(vec![0.0; 6], &[3, 2]).unwrap()),
        Status::Mismatch,
        &["param 'layers.0.w'", "[3, 2]", "[2, 3]"],
    );
    let mut device_grad = [0.0f32; 6];
    // SAFETY: the library refuses the device before it reads any memory; the pointer is
    // valid host memory anyway, should it not.
    let cuda_grad = unsafe {
        Tensor::cuda(
            device_grad.as_mut_ptr() as *mut c_void,
            0,
            DType::Float32,
            &[2, 3],
        )
        .unwrap()
    };
    expect_error(
        "bind_grad(a cuda:0 grad for a cpu param)",
        opt.bind_grad(w, cuda_grad),
        Status::Mismatch,
        &["param 'layers.0.w'", "cuda:0", "cpu"],
    );
    expect_error(
        "bind_grads(1 entry for 1 param, of the wrong shape)",
        opt.bind_grads(vec![Some(Tensor::from_f32(vec![0.0; 5], &[5]).unwrap())]),
        Status::Mismatch,
        &["sa_optimizer_set_grads", "param 'layers.0.w'"],
    );
    expect_error(
        "bind_grads(2 entries for 1 param)",
        opt.bind_grads(vec![None, None]),
        Status::InvalidArgument,
        &["n is 2 but the optimizer has 1 params"],
    );

    // Still the first tensor, with the values written into it.
    assert_eq!(opt.grad_f32_mut(w).unwrap(), &g[..]);
    opt.step().unwrap();
    let mut reference = Reference::new(&init);
    reference.step(&g, &hp, 1, 1.0);
    assert_close(
        "after the refused bindings",
        opt.param_f32(w).unwrap(),
        &reference.p,
    );

    // A copying binding replaces the bound tensor, which is then no longer there to write.
    opt.set_grad(w, &g).unwrap();
    assert!(opt.grad_tensor(w).unwrap().is_none());
    expect_error(
        "grad_f32_mut after set_grad",
        opt.grad_f32_mut(w),
        Status::State,
        &["param 'layers.0.w'", "bind_grad"],
    );
}

/// A CUDA param given to an optimizer that cannot serve the device (here: device 4096,
/// which no machine has; in a build without CUDA, any) is refused with the library's
/// reason, naming the param and the device, and nothing is added.
#[test]
fn a_cuda_param_the_library_cannot_serve_is_refused_with_its_reason() {
    let (mut opt, _) = adamw(1e-2);
    let mut memory = [0.0f32; 4];
    // SAFETY: refused before any memory is read (and the memory is valid host memory).
    let tensor = unsafe {
        Tensor::cuda(
            memory.as_mut_ptr() as *mut c_void,
            4096,
            DType::Float32,
            &[4],
        )
        .unwrap()
    };
    let e = opt
        .add_tensor("gpu.w", 0, tensor, None)
        .expect_err("cuda:4096");
    assert!(
        matches!(e.status, Status::Unsupported | Status::Device),
        "{}",
        e
    );
    for needle in ["sa_optimizer_add_param", "gpu.w", "cuda:4096"] {
        assert!(
            e.message.contains(needle),
            "{:?} lacks {:?}",
            e.message,
            needle
        );
    }
    assert_eq!(opt.device(), None);
    assert!(opt
        .add_param("cpu.w", 0, &[2], vec![1.0, 2.0], None)
        .is_ok());
}

static DELETED: AtomicUsize = AtomicUsize::new(0);

/// A DLPack producer's tensor with a Vec behind it and a deleter that counts its calls.
struct Produced {
    managed: shardadam_sys::DLManagedTensorVersioned,
    shape: Vec<i64>,
    values: Vec<f32>,
}

unsafe extern "C" fn count_deletion(m: *mut shardadam_sys::DLManagedTensorVersioned) {
    drop(Box::from_raw((*m).manager_ctx as *mut Produced));
    DELETED.fetch_add(1, Ordering::SeqCst);
}

fn produce(values: Vec<f32>) -> *mut shardadam_sys::DLManagedTensorVersioned {
    let n = values.len() as i64;
    let p = Box::into_raw(Box::new(Produced {
        managed: shardadam_sys::DLManagedTensorVersioned {
            version: shardadam_sys::DLPackVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(count_deletion),
            flags: 0,
            dl_tensor: shardadam_sys::DLTensor {
                data: std::ptr::null_mut(),
                device: Device::Cpu.raw(),
                ndim: 1,
                dtype: shardadam::dtypes()
                    .iter()
                    .find(|d| d.name == "float32")
                    .unwrap()
                    .dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape: vec![n],
        values,
    }));
    unsafe {
        (*p).managed.manager_ctx = p as *mut c_void;
        (*p).managed.dl_tensor.shape = (*p).shape.as_mut_ptr();
        (*p).managed.dl_tensor.data = (*p).values.as_mut_ptr() as *mut c_void;
        &mut (*p).managed
    }
}

/// Managed tensors: a param's deleter runs once, when the optimizer is dropped; a grad's
/// when its binding is replaced (or refused); the param's values are updated in place in
/// the producer's memory.
#[test]
fn managed_tensors_are_deleted_once_when_no_longer_used() {
    let mut rng = Rng(47);
    let (mut opt, hp) = adamw(1e-2);
    let init = rng.values(4);
    let param = produce(init.clone());
    let param_values = unsafe { (*param).dl_tensor.data as *const f32 };
    let w = opt
        .add_tensor(
            "w",
            0,
            unsafe { Tensor::from_managed(param) }.unwrap(),
            None,
        )
        .unwrap();
    let g = rng.values(4);
    opt.bind_grad(
        w,
        unsafe { Tensor::from_managed(produce(g.clone())) }.unwrap(),
    )
    .unwrap();
    assert_eq!(DELETED.load(Ordering::SeqCst), 0);
    opt.step().unwrap();
    let mut reference = Reference::new(&init);
    reference.step(&g, &hp, 1, 1.0);
    let values = unsafe { std::slice::from_raw_parts(param_values, 4) }.to_vec();
    assert_close("the producer's memory", &values, &reference.p);

    let refused = unsafe { Tensor::from_managed(produce(vec![0.0; 3])) }.unwrap();
    assert!(opt.bind_grad(w, refused).is_err());
    assert_eq!(
        DELETED.load(Ordering::SeqCst),
        1,
        "the refused grad is deleted"
    );
    opt.set_grad(w, &g).unwrap();
    assert_eq!(
        DELETED.load(Ordering::SeqCst),
        2,
        "the replaced grad is deleted"
    );
    drop(opt);
    assert_eq!(
        DELETED.load(Ordering::SeqCst),
        3,
        "the param is deleted with the optimizer"
    );
}
