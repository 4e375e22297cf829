//! A first step on the GPU from Rust: a [4, 3] float32 weight and its grad in CUDA device
//! memory, the grad buffer bound once, and 100 steps that each copy a fresh grad into it and
//! enqueue the update on a stream, fitting the weight to a target. Without a GPU (or a CUDA
//! runtime) it prints why it skipped and exits 0.
//!
//! The device memory and the stream come from the CUDA runtime, loaded at run time by the
//! small `cudart` module beside this file; the shardadam crate takes them as pointers.
//!
//!     cargo run --offline --example gpu_step
mod cudart;

use shardadam::{DType, GroupConfig, Optimizer, StepArgs, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = match cudart::Cudart::load().and_then(|rt| rt.device_count().map(|_| rt)) {
        Ok(rt) => rt,
        Err(why) => {
            println!("gpu_step: skipped: {}", why);
            return Ok(());
        }
    };
    rt.set_device(0)?;
    println!("{}\n{}", shardadam::build_info(), rt.describe());
    let stream = rt.stream()?;

    let shape = [4i64, 3];
    let n = 12;
    let target: Vec<f32> = (0..n).map(|i| i as f32 / 4.0 - 1.0).collect();
    let w_memory = rt.alloc(4 * n)?;
    let grad_memory = rt.alloc(4 * n)?;
    let mut values = vec![0.0f32; n]; // the weight as the host last saw it
    stream.upload(w_memory.ptr(), &values)?; // read by the copy later: `values` lives on

    // Declared after the memory, so dropped before it: the optimizer uses it to the end.
    let mut opt = Optimizer::new(None)?;
    opt.add_group(&GroupConfig::new().set("lr", 0.05).set("weight_decay", 0.0))?;
    // SAFETY: each buffer holds n float32 values on device 0 and outlives `opt`.
    let (w_tensor, grad_tensor) = unsafe {
        (
            Tensor::cuda(w_memory.ptr(), 0, DType::Float32, &shape)?,
            Tensor::cuda(grad_memory.ptr(), 0, DType::Float32, &shape)?,
        )
    };
    let w = opt.add_tensor("w", 0, w_tensor, None)?;
    opt.bind_grad(w, grad_tensor)?; // once: every step reads the grads from grad_memory

    let mut first_loss = 0.0;
    for step in 1..=100 {
        // loss = 1/2 |w - target|^2, so the grad is w - target (computed on the host here).
        let grad: Vec<f32> = values.iter().zip(&target).map(|(w, t)| w - t).collect();
        let loss: f32 = grad.iter().map(|g| 0.5 * g * g).sum();
        if step == 1 {
            first_loss = loss;
        }
        if step == 1 || step % 25 == 0 {
            println!("step {:3}  loss {:.5}", step, loss);
        }
        // Into the bound buffer, on the stream; the step, on the same stream, runs after it.
        stream.upload(grad_memory.ptr(), &grad)?;
        // SAFETY: a live stream of device 0.
        unsafe { opt.step_on(&StepArgs::default(), stream.raw())? };
        stream.download(&mut values, w_memory.ptr())?; // after the step; waits for it
    }
    let loss: f32 = values
        .iter()
        .zip(&target)
        .map(|(w, t)| 0.5 * (w - t) * (w - t))
        .sum();
    println!("after 100 steps: loss {:.5} (from {:.5})", loss, first_loss);
    assert!(loss < 0.01 * first_loss, "the loss did not fall");
    Ok(())
}
