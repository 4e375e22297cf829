//! Helpers shared by the integration tests: seeded test data, the independent float64
//! reference of the update in shardadam.h, and the comparison against it.
#![allow(dead_code)] // each test crate uses its own subset

use shardadam::{Error, GroupConfig, Layout, Placement, Status};

/// splitmix64: a seeded, dependency-free source of test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-2, 2).
    pub fn value(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f64 / (1u64 << 24) as f64 * 4.0 - 2.0) as f32
    }

    pub fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.value()).collect()
    }
}

/// The float64 reference: Adam/AdamW with PyTorch semantics.
pub struct Reference {
    pub p: Vec<f64>,
    pub m: Vec<f64>,
    pub v: Vec<f64>,
    pub vmax: Vec<f64>,
}

impl Reference {
    pub fn new(init: &[f32]) -> Self {
        let n = init.len();
        Reference {
            p: init.iter().map(|&x| x as f64).collect(),
            m: vec![0.0; n],
            v: vec![0.0; n],
            vmax: vec![0.0; n],
        }
    }

    #[allow(clippy::needless_range_loop)] // five arrays walked in step read best indexed
    pub fn step(&mut self, grad: &[f32], hp: &GroupConfig, t: i32, inv_grad_scale: f64) {
        let (bc1, bc2) = if hp.bias_correction {
            (1.0 - hp.beta1.powi(t), 1.0 - hp.beta2.powi(t))
        } else {
            (1.0, 1.0)
        };
        for i in 0..self.p.len() {
            let mut g = grad[i] as f64 * inv_grad_scale;
            if hp.maximize {
                g = -g;
            }
            if hp.weight_decay != 0.0 {
                if hp.decoupled_weight_decay {
                    self.p[i] *= 1.0 - hp.lr * hp.weight_decay;
                } else {
                    g += hp.weight_decay * self.p[i];
                }
            }
            self.m[i] = hp.beta1 * self.m[i] + (1.0 - hp.beta1) * g;
            self.v[i] = hp.beta2 * self.v[i] + (1.0 - hp.beta2) * g * g;
            let mut v = self.v[i];
            if hp.amsgrad {
                self.vmax[i] = self.vmax[i].max(self.v[i]);
                v = self.vmax[i];
            }
            self.p[i] -= (hp.lr / bc1) * self.m[i] / (v.sqrt() / bc2.sqrt() + hp.eps);
        }
    }
}

/// Fails unless every value is within float32 accuracy of the reference.
pub fn assert_close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{}: length", what);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let diff = (g as f64 - w).abs();
        assert!(
            diff <= 1e-6 + 1e-5 * w.abs(),
            "{}[{}] = {:.9}, float64 reference {:.9} (diff {:.3e})",
            what,
            i,
            g,
            w,
            diff
        );
    }
}

pub fn shard_rows(global: [i64; 2], ranks: i64, coord: i64) -> Layout {
    Layout::Mesh {
        global_shape: global.to_vec(),
        mesh_shape: vec![ranks],
        mesh_coord: vec![coord],
        placements: vec![Placement::Shard(0)],
    }
}

/// `result` is an error of `status` whose message holds every needle.
pub fn expect_error<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
    status: Status,
    needles: &[&str],
) {
    let e = result.expect_err(what);
    assert_eq!(e.status, status, "{}: {}", what, e);
    for needle in needles {
        assert!(
            e.message.contains(needle),
            "{}: message {:?} lacks {:?}",
            what,
            e.message,
            needle
        );
    }
}
