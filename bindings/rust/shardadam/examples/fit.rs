//! Fits a [6, 4] weight to a target with AdamW, the weight sharded by rows over a mesh of 2
//! simulated ranks (one optimizer per rank, as each rank of a real job would have), and
//! prints the loss as it falls. Then it shows what a failed call returns.
//!
//! Run it from bindings/rust with PKG_CONFIG_PATH naming the directory of shardadam.pc
//! (`<prefix>/lib/pkgconfig` of an install, `<build>/pkgconfig` of a build tree), or
//! SHARDADAM_LIB_DIR the library's directory; it finds the library through its rpath:
//!
//!     cargo run --offline --example fit
use shardadam::{DType, GroupConfig, Layout, Optimizer, Param, ParamOptions, Placement};

/// One simulated rank: its optimizer, its shard of the weight and of the target.
struct Rank {
    opt: Optimizer,
    w: Param,
    target: Vec<f32>,
}

fn main() -> Result<(), shardadam::Error> {
    println!("{}", shardadam::build_info());
    let global = [6i64, 4];
    // A deterministic target without a random number crate.
    let target: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
    // Fields not named keep the library's defaults (torch.optim.AdamW's).
    let hp = GroupConfig::new().set("lr", 0.1).set("weight_decay", 0.0);

    let mut ranks = Vec::new();
    for r in 0..2 {
        let layout = Layout::Mesh {
            global_shape: global.to_vec(),
            mesh_shape: vec![2],
            mesh_coord: vec![r],
            placements: vec![Placement::Shard(0)],
        };
        let (local, offset) = layout.local_box()?;
        let mut opt = Optimizer::new(None)?;
        opt.add_group(&hp)?;
        let numel = (local[0] * local[1]) as usize;
        let options = ParamOptions {
            layout: Some(layout),
            ..ParamOptions::default()
        };
        let w = opt.add_param("fit.w", 0, &local, vec![0.0; numel], Some(&options))?;
        let start = (offset[0] * global[1]) as usize; // row-major: rows [offset, offset + local)
        println!(
            "rank {} holds rows [{}, {})",
            r,
            offset[0],
            offset[0] + local[0]
        );
        ranks.push(Rank {
            opt,
            w,
            target: target[start..start + numel].to_vec(),
        });
    }

    // The group as the library holds it: every field it knows, by its name.
    let fields: Vec<String> = ranks[0]
        .opt
        .group(0)?
        .fields()
        .map(|(name, value)| format!("{} {:?}", name, value))
        .collect();
    println!("group 0: {}", fields.join(", "));

    let (mut first_loss, mut loss) = (0.0f64, 0.0f64);
    for step in 1..=60 {
        loss = 0.0;
        for rank in &mut ranks {
            // loss = 1/2 |w - target|^2, so grad = w - target.
            let grad: Vec<f32> = rank
                .opt
                .param_f32(rank.w)?
                .iter()
                .zip(&rank.target)
                .map(|(w, t)| w - t)
                .collect();
            loss += grad.iter().map(|g| 0.5 * (g * g) as f64).sum::<f64>();
            rank.opt.set_grad(rank.w, &grad)?;
            rank.opt.step()?;
        }
        if step == 1 {
            first_loss = loss;
        }
        if step == 1 || step % 20 == 0 {
            println!("step {:2}  loss {:.5}", step, loss);
        }
    }
    assert!(
        loss < 0.01 * first_loss,
        "the loss fell only from {} to {}",
        first_loss,
        loss
    );

    // A failed call: the status and the library's message, which names the param.
    let rank = &mut ranks[0];
    let n = rank.target.len();
    if let Err(e) = rank.opt.set_grad16(rank.w, DType::BFloat16, &vec![0u16; n]) {
        println!("status {}: {}", e.status.name(), e.message);
    }
    Ok(())
}
