//! A Muon group (`update_rule` [`RULE_MUON`]) from Rust: the field table says which rules read
//! each field; a row matrix is stepped as Newton-Schulz does a 1 x n matrix, which has a
//! closed form (its Gram matrix is the scalar |x|^2, so each iteration scales x by
//! a + b s + c s^2 and s by that factor squared); a vector is refused by name.
mod common;

use common::expect_error;
use shardadam::{group_fields, GroupConfig, Optimizer, Status, RULE_ADAMW, RULE_MUON};

#[test]
fn the_field_table_says_which_rules_read_each_field() {
    let adamw = 1 << RULE_ADAMW;
    let muon = 1 << RULE_MUON;
    for field in group_fields() {
        let want = match field.name.as_str() {
            "lr" | "eps" | "weight_decay" | "update_rule" => adamw | muon,
            "momentum" | "nesterov" | "ns_a" | "ns_b" | "ns_c" | "ns_steps" | "adjust_lr" => muon,
            _ => adamw,
        };
        assert_eq!(field.rules, want, "{}: rules", field.name);
        let integer = field.flag || ["update_rule", "ns_steps", "adjust_lr"].contains(&field.name.as_str());
        assert_eq!(field.integer, integer, "{}: integer", field.name);
    }
}

#[test]
fn a_muon_group_steps_a_row_matrix_by_the_closed_form_of_newton_schulz() {
    let mut opt = Optimizer::new(None).unwrap();
    let group = opt
        .add_group(
            &GroupConfig::new()
                .set("update_rule", RULE_MUON as f64)
                .set("lr", 0.1)
                .set("weight_decay", 0.01)
                .set("momentum", 0.5)
                .set("nesterov", 0.0),
        )
        .unwrap();
    let start = [1.0f32, 2.0, 3.0, 4.0];
    let grad = [0.4f32, -0.2, 0.1, 0.3];
    let p = opt.add_param("row", group, &[1, 4], start.to_vec(), None).unwrap();
    opt.set_grad(p, &grad).unwrap();
    opt.step().unwrap();
    // buf = (1 - momentum) g from zero; u = buf (no Nesterov); o = u / |u| times the
    // iterations' factors; the lr is not adjusted (rows / cols < 1).
    let buf: Vec<f64> = grad.iter().map(|&g| 0.5 * g as f64).collect();
    let norm = buf.iter().map(|v| v * v).sum::<f64>().sqrt();
    let (a, b, c) = (3.4445, -4.775, 2.0315);
    let (mut s, mut scale) = (1.0f64, 1.0f64);
    for _ in 0..5 {
        let f = a + b * s + c * s * s;
        scale *= f;
        s *= f * f;
    }
    let got = opt.param_f32(p).unwrap().to_vec();
    for i in 0..4 {
        let want = start[i] as f64 * (1.0 - 0.1 * 0.01) - 0.1 * scale * buf[i] / norm;
        assert!((got[i] as f64 - want).abs() < 1e-6, "element {}: {} against {}", i, got[i], want);
    }
    assert!((got[0] as f64 - start[0] as f64).abs() > 1e-3, "the step moved the param");
    let momentum = opt.state(p, "momentum_buffer").unwrap();
    for i in 0..4 {
        assert!((momentum[i] as f64 - buf[i]).abs() < 1e-7, "momentum_buffer[{}]", i);
    }
}

#[test]
fn a_muon_group_refuses_a_vector_by_name() {
    let mut opt = Optimizer::new(None).unwrap();
    let group = opt
        .add_group(&GroupConfig::new().set("update_rule", RULE_MUON as f64))
        .unwrap();
    expect_error(
        "add_param(a vector into a Muon group)",
        opt.add_param("norm", group, &[8], vec![0.0; 8], None),
        Status::InvalidArgument,
        &["param 'norm'", "2-D", "AdamW group"],
    );
}
