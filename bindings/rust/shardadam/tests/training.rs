//! Training with params and grads in memory the caller allocated, the grads bound once: a
//! linear regression trained for 300 steps against the independent float64 update of
//! tests/common, the loss falling; and a step whose loss scale, found-inf flag and norm
//! are in that memory too (StepArgs' addresses). Each runs on host memory (every machine)
//! and on a CUDA device (device memory from cudaMalloc through the CUDA runtime, loaded at
//! run time; the grads written by copies on the step's stream).
//!
//! Without a GPU or a CUDA runtime the GPU test says "SKIPPED" on stderr (uncaptured, so
//! it shows in `cargo test`'s output) and passes; with SHARDADAM_REQUIRE_GPU=1 (as
//! bindings/rust/gpu/run_on_gpu.sh sets it) it fails instead.
mod common;
#[path = "../examples/cudart/mod.rs"]
mod cudart;

use common::{assert_close, assert_scale_matters, Hyper, Reference, Rng};
use shardadam::{DType, Device, Optimizer, Status, StepArgs, Tensor};
use std::io::Write;
use std::os::raw::c_void;

/// The CUDA runtime with device 0 current, or None after saying why there is none.
fn cuda_or_skip(test: &str) -> Option<cudart::Cudart> {
    match cudart::Cudart::load().and_then(|rt| rt.device_count().map(|_| rt)) {
        Ok(rt) => {
            rt.set_device(0).unwrap();
            Some(rt)
        }
        Err(why) => {
            if std::env::var("SHARDADAM_REQUIRE_GPU").map_or(false, |v| v == "1") {
                panic!("{}: SHARDADAM_REQUIRE_GPU=1 but {}", test, why);
            }
            // Straight to stderr: the test harness captures only print! and eprint!.
            let _ = writeln!(std::io::stderr(), "SKIPPED: {}: {}", test, why);
            None
        }
    }
}

/// y = x W* + b* + noise for `n` samples of `d_in` features and `d_out` outputs.
struct Regression {
    n: usize,
    d_in: usize,
    d_out: usize,
    x: Vec<f32>,
    y: Vec<f32>,
}

impl Regression {
    fn new(rng: &mut Rng, n: usize, d_in: usize, d_out: usize) -> Regression {
        let x = rng.values(n * d_in);
        let w_true = rng.values(d_in * d_out);
        let b_true = rng.values(d_out);
        let mut y = vec![0.0f32; n * d_out];
        for s in 0..n {
            for o in 0..d_out {
                let dot: f32 = (0..d_in)
                    .map(|i| x[s * d_in + i] * w_true[i * d_out + o])
                    .sum();
                y[s * d_out + o] = dot + b_true[o] + 0.01 * rng.value();
            }
        }
        Regression {
            n,
            d_in,
            d_out,
            x,
            y,
        }
    }

    /// The loss 1/(2n) |x w + b - y|^2 and its grads with respect to w and b, in float64
    /// (then rounded to the float32 the grad buffers hold).
    fn loss_and_grads(&self, w: &[f32], b: &[f32]) -> (f64, Vec<f32>, Vec<f32>) {
        let (n, d_in, d_out) = (self.n, self.d_in, self.d_out);
        let mut loss = 0.0f64;
        let mut gw = vec![0.0f64; d_in * d_out];
        let mut gb = vec![0.0f64; d_out];
        for s in 0..n {
            for o in 0..d_out {
                let mut r = b[o] as f64 - self.y[s * d_out + o] as f64;
                for i in 0..d_in {
                    r += self.x[s * d_in + i] as f64 * w[i * d_out + o] as f64;
                }
                loss += 0.5 * r * r / n as f64;
                gb[o] += r / n as f64;
                for i in 0..d_in {
                    gw[i * d_out + o] += self.x[s * d_in + i] as f64 * r / n as f64;
                }
            }
        }
        let f32s = |v: Vec<f64>| v.into_iter().map(|g| g as f32).collect();
        (loss, f32s(gw), f32s(gb))
    }
}

/// Where the test's params and grads live: float32 buffers, copies in and out, a stream.
trait Memory {
    type Buffer;
    fn device(&self) -> Device;
    fn alloc(&self, n: usize) -> Self::Buffer;
    fn address(&self, buffer: &mut Self::Buffer) -> *mut c_void;
    /// Writes `src` into the buffer at `dst` before the next step (on the stream).
    fn upload(&self, dst: *mut c_void, src: &[f32]);
    /// Reads the buffer at `src` after the previous step.
    fn download(&self, dst: &mut [f32], src: *mut c_void);
    fn stream(&self) -> *mut c_void;
}

/// Host memory the test allocates: Vecs, used only through their addresses while bound.
struct Host;

impl Memory for Host {
    type Buffer = Vec<f32>;
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn alloc(&self, n: usize) -> Vec<f32> {
        vec![0.0; n]
    }
    fn address(&self, buffer: &mut Vec<f32>) -> *mut c_void {
        buffer.as_mut_ptr() as *mut c_void
    }
    fn upload(&self, dst: *mut c_void, src: &[f32]) {
        // SAFETY: dst is a buffer of src.len() values that no step is reading now.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut f32, src.len()) }
    }
    fn download(&self, dst: &mut [f32], src: *mut c_void) {
        // SAFETY: as upload.
        unsafe { std::ptr::copy_nonoverlapping(src as *const f32, dst.as_mut_ptr(), dst.len()) }
    }
    fn stream(&self) -> *mut c_void {
        std::ptr::null_mut()
    }
}

/// Device 0's memory and a stream on it.
struct Cuda<'a> {
    rt: &'a cudart::Cudart,
    stream: cudart::Stream<'a>,
}

impl<'a> Memory for Cuda<'a> {
    type Buffer = cudart::DeviceBuffer<'a>;
    fn device(&self) -> Device {
        Device::Cuda(0)
    }
    fn alloc(&self, n: usize) -> cudart::DeviceBuffer<'a> {
        self.rt.alloc(4 * n).unwrap()
    }
    fn address(&self, buffer: &mut cudart::DeviceBuffer<'a>) -> *mut c_void {
        buffer.ptr()
    }
    fn upload(&self, dst: *mut c_void, src: &[f32]) {
        self.stream.upload(dst, src).unwrap();
        // src is the caller's temporary: wait until the copy has read it.
        self.stream.synchronize().unwrap();
    }
    fn download(&self, dst: &mut [f32], src: *mut c_void) {
        self.stream.download(dst, src).unwrap();
    }
    fn stream(&self) -> *mut c_void {
        self.stream.raw()
    }
}

/// A [16, 4] weight and a [4] bias trained on 128 samples for 300 AdamW steps, params
/// and grads all in `memory`: both grads bound once (one from a pointer, one from a
/// DLTensor), each step's grads computed on the host from the params read back and written
/// into the bound buffers before the step. Every step's update matches the float64
/// reference (applied to the params the step started from), the grad buffers are never
/// rebound, the per-param step counts reach 300, and the loss falls below 2% of its start.
/// On a device, calls that need host memory refuse device memory with a message.
fn train_a_regression<M: Memory>(memory: &M) {
    let mut rng = Rng(53);
    let data = Regression::new(&mut rng, 128, 16, 4);
    let (nw, nb) = (16 * 4, 4);
    let mut buffers = [
        memory.alloc(nw),
        memory.alloc(nb),
        memory.alloc(nw),
        memory.alloc(nb),
    ];
    let [w_at, b_at, gw_at, gb_at] = {
        let [a, b, c, d] = &mut buffers;
        [
            memory.address(a),
            memory.address(b),
            memory.address(c),
            memory.address(d),
        ]
    };
    let w_init: Vec<f32> = rng.values(nw).iter().map(|v| 0.1 * v).collect();
    let b_init = vec![0.0f32; nb];
    memory.upload(w_at, &w_init);
    memory.upload(b_at, &b_init);

    let hp = Hyper {
        lr: 2e-2,
        ..Hyper::ADAMW
    };
    let device = memory.device();
    // Declared after the buffers, so dropped before them.
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&hp.config()).unwrap();
    let mut gb_shape = [nb as i64];
    let gb_dl = shardadam_sys::DLTensor {
        data: gb_at,
        device: device.raw(),
        ndim: 1,
        dtype: shardadam::dtypes()
            .iter()
            .find(|d| d.name == "float32")
            .unwrap()
            .dtype,
        shape: gb_shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    // SAFETY: the buffers hold nw and nb float32 values on `device` and outlive `opt`; they
    // are written only between steps (on a device: on the step's stream); the DLTensor's
    // shape is read when the tensor is made.
    let (w, b) = unsafe {
        let tensor =
            |at, shape: &[i64]| Tensor::from_raw_parts(at, device, DType::Float32, shape).unwrap();
        let w = opt
            .add_tensor("w", 0, tensor(w_at, &[16, 4]), None)
            .unwrap();
        let b = opt.add_tensor("b", 0, tensor(b_at, &[4]), None).unwrap();
        opt.bind_grads(vec![
            Some(tensor(gw_at, &[16, 4])),
            Some(Tensor::from_dl_tensor(&gb_dl).unwrap()),
        ])
        .unwrap();
        (w, b)
    };
    assert_eq!(opt.device(), Some(device));

    if device != Device::Cpu {
        // A host grad for a device param: the library's message names both devices, and
        // the device binding stays.
        let e = opt
            .bind_grad(w, Tensor::from_f32(vec![0.0; nw], &[16, 4]).unwrap())
            .expect_err("a host grad for a device param");
        assert_eq!(e.status, Status::Mismatch, "{}", e);
        assert!(
            e.message.contains("cpu") && e.message.contains("cuda:0"),
            "{}",
            e
        );
        assert_eq!(
            opt.state(w, "exp_avg").unwrap_err().status,
            Status::Unsupported
        );
        assert_eq!(opt.param_f32(w).unwrap_err().status, Status::Unsupported);
        let scaled = unsafe {
            opt.step_on(
                &StepArgs {
                    inv_grad_scale: Some(0.5),
                    ..StepArgs::default()
                },
                memory.stream(),
            )
        };
        assert_eq!(scaled.unwrap_err().status, Status::Unsupported);
    }

    let mut w_ref = Reference::new(&w_init);
    let mut b_ref = Reference::new(&b_init);
    let (mut w_now, mut b_now) = (w_init.clone(), b_init.clone());
    let mut losses = Vec::new();
    for t in 1..=300 {
        let (loss, gw, gb) = data.loss_and_grads(&w_now, &b_now);
        losses.push(loss);
        memory.upload(gw_at, &gw);
        memory.upload(gb_at, &gb);
        // SAFETY: NULL or a live stream of the device; the step runs after the uploads.
        unsafe { opt.step_on(&StepArgs::default(), memory.stream()) }.unwrap();
        memory.download(&mut w_now, w_at);
        memory.download(&mut b_now, b_at);
        // The reference's moments follow the grads alone; its params restart each step
        // from the library's, so float32 rounding does not accumulate over 300 steps.
        w_ref.step(&gw, &hp, t, 1.0);
        b_ref.step(&gb, &hp, t, 1.0);
        assert_close(&format!("{:?} step {}: w", device, t), &w_now, &w_ref.p);
        assert_close(&format!("{:?} step {}: b", device, t), &b_now, &b_ref.p);
        w_ref.p = w_now.iter().map(|&v| v as f64).collect();
        b_ref.p = b_now.iter().map(|&v| v as f64).collect();
        assert_eq!(opt.grad_tensor(w).unwrap().unwrap().data_ptr(), gw_at);
        assert_eq!(opt.grad_tensor(b).unwrap().unwrap().data_ptr(), gb_at);
        if t == 1 || t % 100 == 0 {
            eprintln!("{:?} step {:3}  loss {:.6}", device, t, loss);
        }
    }
    assert_eq!(opt.param_steps(0, 2).unwrap(), vec![300, 300]);
    let (last, _, _) = data.loss_and_grads(&w_now, &b_now);
    eprintln!(
        "{:?}: after 300 steps: loss {:.6} (from {:.6})",
        device, last, losses[0]
    );
    assert!(
        last < 0.02 * losses[0],
        "the loss fell only from {} to {}",
        losses[0],
        last
    );
}

/// [`train_a_regression`] in host memory the test allocated.
#[test]
fn a_regression_in_host_memory_with_grads_bound_once_matches_the_reference() {
    train_a_regression(&Host);
}

/// [`train_a_regression`] in the memory of CUDA device 0, on a stream of its own.
#[test]
fn gpu_a_regression_in_device_memory_with_grads_bound_once_matches_the_reference() {
    let rt = match cuda_or_skip("gpu training test") {
        Some(rt) => rt,
        None => return,
    };
    eprintln!("{}\n{}", shardadam::build_info(), rt.describe());
    let memory = Cuda {
        rt: &rt,
        stream: rt.stream().unwrap(),
    };
    train_a_regression(&memory);
    memory.stream.synchronize().unwrap();
}

/// The loss scale and the found-inf flag of a step read from `memory` at their addresses
/// (`StepArgs::inv_grad_scale_at`, `found_inf_at`) and the norm written there
/// (`grad_norm_at`): device memory on a device, as a GPU loss scaler keeps them. A flag of
/// 1 skips the step (the param unchanged); with the flag 0 the step matches the float64
/// reference at a scale of 0.5, under Adam with L2 decay (where the scale changes the
/// update), and the norm is that of the scaled grads.
fn scale_flag_and_norm_at_addresses<M: Memory>(memory: &M) {
    let l2 = Hyper {
        lr: 0.01,
        weight_decay: 0.5,
        decoupled_weight_decay: false,
        ..Hyper::ADAMW
    };
    let mut rng = Rng(61);
    let n = 37;
    let init = rng.values(n);
    let grad = rng.values(n);
    let mut buffers = [
        memory.alloc(n),
        memory.alloc(n),
        memory.alloc(1),
        memory.alloc(1),
        memory.alloc(1),
    ];
    let [w_at, g_at, scale_at, flag_at, norm_at] = {
        let [a, b, c, d, e] = &mut buffers;
        [
            memory.address(a),
            memory.address(b),
            memory.address(c),
            memory.address(d),
            memory.address(e),
        ]
    };
    memory.upload(w_at, &init);
    memory.upload(g_at, &grad);
    memory.upload(scale_at, &[0.5]);
    memory.upload(flag_at, &[1.0]);
    let device = memory.device();
    // Declared after the buffers, so dropped before them.
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&l2.config()).unwrap();
    // SAFETY: the buffers hold n float32 values on `device` and outlive `opt`.
    unsafe {
        let w = Tensor::from_raw_parts(w_at, device, DType::Float32, &[n as i64]).unwrap();
        let g = Tensor::from_raw_parts(g_at, device, DType::Float32, &[n as i64]).unwrap();
        let w = opt.add_tensor("w", 0, w, None).unwrap();
        opt.bind_grad(w, g).unwrap();
    }
    let measure = StepArgs {
        max_grad_norm: Some(f64::INFINITY),
        ..StepArgs::default()
    };
    // SAFETY: one float32 each in the optimizer's memory, live until `opt` is dropped; the
    // host writes them only between steps (on a device: on the step's stream).
    let args = unsafe {
        measure
            .inv_grad_scale_at(scale_at as *const f32)
            .found_inf_at(flag_at as *const f32)
            .grad_norm_at(norm_at as *mut f32)
    };

    // SAFETY (both steps): NULL or a live stream of the device.
    let report = unsafe { opt.step_on(&args, memory.stream()) }.unwrap();
    assert!(
        report.skipped,
        "{:?}: the flag at found_inf_at was 1",
        device
    );
    let mut now = vec![0.0f32; n];
    memory.download(&mut now, w_at);
    assert_eq!(now, init, "{:?}: a skipped step changed the param", device);
    assert_eq!(
        opt.param_steps(0, 1).unwrap(),
        vec![0],
        "{:?}: skipped",
        device
    );

    memory.upload(flag_at, &[0.0]);
    let report = unsafe { opt.step_on(&args, memory.stream()) }.unwrap();
    assert!(
        !report.skipped,
        "{:?}: the flag at found_inf_at was 0",
        device
    );
    assert_eq!(
        opt.param_steps(0, 1).unwrap(),
        vec![1],
        "{:?}: stepped",
        device
    );
    memory.download(&mut now, w_at);
    let mut reference = Reference::new(&init);
    reference.step(&grad, &l2, 1, 0.5);
    assert_scale_matters(&init, &grad, &l2);
    assert_close(
        &format!("{:?}: the scaled step", device),
        &now,
        &reference.p,
    );

    let want = grad
        .iter()
        .map(|&g| (g as f64 * 0.5).powi(2))
        .sum::<f64>()
        .sqrt();
    let reported = report.grad_norm.unwrap();
    assert!(
        (reported - want).abs() <= 1e-9 * want,
        "{:?}: reported norm {} against {}",
        device,
        reported,
        want
    );
    let mut written = [0.0f32];
    memory.download(&mut written, norm_at);
    assert!(
        (written[0] as f64 - want).abs() <= 1e-6 * want,
        "{:?}: the f32 at grad_norm_at holds {} against {}",
        device,
        written[0],
        want
    );
}

/// [`scale_flag_and_norm_at_addresses`] in host memory the test allocated.
#[test]
fn a_cpu_step_reads_its_scale_and_flag_and_writes_its_norm_at_host_addresses() {
    scale_flag_and_norm_at_addresses(&Host);
}

/// [`scale_flag_and_norm_at_addresses`] in the memory of CUDA device 0.
#[test]
fn gpu_a_cuda_step_reads_its_scale_and_flag_and_writes_its_norm_at_device_addresses() {
    let rt = match cuda_or_skip("gpu step memory test") {
        Some(rt) => rt,
        None => return,
    };
    let memory = Cuda {
        rt: &rt,
        stream: rt.stream().unwrap(),
    };
    scale_flag_and_norm_at_addresses(&memory);
    memory.stream.synchronize().unwrap();
}
