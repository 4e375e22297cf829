//! Helpers shared by the integration tests: seeded test data, the independent float64
//! reference of the update in shardadam.h with its hyperparameters, and the comparison
//! against it.
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

/// A group's hyperparameters as the reference reads them. Written out here, every one, so
/// the reference never takes a value from the library it checks.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Hyper {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub decoupled_weight_decay: bool,
    pub bias_correction: bool,
    pub maximize: bool,
    pub amsgrad: bool,
}

impl Hyper {
    /// torch.optim.AdamW's documented defaults.
    pub const ADAMW: Hyper = Hyper {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 1e-2,
        decoupled_weight_decay: true,
        bias_correction: true,
        maximize: false,
        amsgrad: false,
    };

    /// The fields by the library's names, flags as 0 or 1.
    pub fn fields(&self) -> [(&'static str, f64); 9] {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        [
            ("lr", self.lr),
            ("beta1", self.beta1),
            ("beta2", self.beta2),
            ("eps", self.eps),
            ("weight_decay", self.weight_decay),
            ("decoupled_weight_decay", flag(self.decoupled_weight_decay)),
            ("bias_correction", flag(self.bias_correction)),
            ("maximize", flag(self.maximize)),
            ("amsgrad", flag(self.amsgrad)),
        ]
    }

    /// A config naming every field.
    pub fn config(&self) -> GroupConfig {
        self.fields()
            .iter()
            .fold(GroupConfig::new(), |config, (name, value)| {
                config.set(name, *value)
            })
    }

    /// Fails unless `config` gives every field this value.
    pub fn assert_matches(&self, what: &str, config: &GroupConfig) {
        for (name, value) in self.fields() {
            assert_eq!(config.get(name), Some(value), "{}: {}", what, name);
        }
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
    pub fn step(&mut self, grad: &[f32], hp: &Hyper, t: i32, inv_grad_scale: f64) {
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

/// Fails unless a step at loss scale 0.5 lands measurably apart from the unscaled step, so
/// that a test which expects the scaled one can tell an ignored scale from a read one.
pub fn assert_scale_matters(init: &[f32], grad: &[f32], hyper: &Hyper) {
    let mut scaled = Reference::new(init);
    scaled.step(grad, hyper, 1, 0.5);
    let mut unscaled = Reference::new(init);
    unscaled.step(grad, hyper, 1, 1.0);
    let apart = unscaled
        .p
        .iter()
        .zip(&scaled.p)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        apart > 1e-3,
        "a scale of 0.5 moves the step by only {}",
        apart
    );
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
