//! Group hyperparameters by name: the field table the library lists, its defaults against
//! torch.optim.AdamW's documented values, what a config that names only some fields does
//! (add: defaults for the rest; set: the rest stay), and the library's refusals.
mod common;

use common::{expect_error, Hyper};
use shardadam::{group_fields, GroupConfig, Optimizer, Status};

/// torch.optim.AdamW's documented defaults, in sa_group_config's order; a flag as 0 or 1
/// (`decoupled_weight_decay` 1 is what makes it AdamW rather than Adam).
const TORCH_ADAMW: [(&str, f64); 9] = [
    ("lr", 1e-3),
    ("beta1", 0.9),
    ("beta2", 0.999),
    ("eps", 1e-8),
    ("weight_decay", 1e-2),
    ("decoupled_weight_decay", 1.0),
    ("bias_correction", 1.0),
    ("maximize", 0.0),
    ("amsgrad", 0.0),
];

const FLAGS: [&str; 4] = [
    "decoupled_weight_decay",
    "bias_correction",
    "maximize",
    "amsgrad",
];

#[test]
fn defaults_are_torch_adamw() {
    let defaults = GroupConfig::defaults();
    for (name, value) in TORCH_ADAMW {
        assert_eq!(defaults.get(name), Some(value), "default of {}", name);
    }
    // A group that names nothing gets them too.
    let mut opt = Optimizer::new(None).unwrap();
    let group = opt.add_group(&GroupConfig::new()).unwrap();
    assert_eq!(opt.group(group).unwrap(), defaults);
}

/// The nine fields in struct order with their kind and default. A newer library may list
/// more after them (sa_group_config only grows at the end); every field, known here or
/// not, has a unique name, words for its rule and doc, and a default its rule accepts.
#[test]
fn group_fields_lists_the_nine_fields_in_struct_order() {
    let fields = group_fields();
    assert!(fields.len() >= 9, "{} fields: {:?}", fields.len(), fields);
    for (field, (name, default)) in fields.iter().zip(TORCH_ADAMW) {
        assert_eq!(field.name, name);
        assert_eq!(field.default, default, "{}", name);
        assert_eq!(field.flag, FLAGS.contains(&name), "{}: flag", name);
        assert_eq!(
            field.fixed_with_params,
            name == "amsgrad",
            "{}: fixed_with_params",
            name
        );
    }
    let beta1 = &fields[1];
    assert_eq!(
        (beta1.min, beta1.max, beta1.max_inclusive),
        (0.0, 1.0, false),
        "beta1 is in [0, 1)"
    );
    for field in &fields {
        assert_eq!(
            fields.iter().filter(|f| f.name == field.name).count(),
            1,
            "{} listed twice",
            field.name
        );
        assert!(
            !field.rule.is_empty() && !field.doc.is_empty(),
            "{:?}",
            field
        );
        let below_max = if field.max_inclusive {
            field.default <= field.max
        } else {
            field.default < field.max
        };
        assert!(field.min <= field.default && below_max, "{:?}", field);
        if field.flag {
            assert_eq!(
                (field.min, field.max, field.max_inclusive),
                (0.0, 1.0, true),
                "{}: a flag is 0 or 1",
                field.name
            );
        }
    }
}

/// group() names every field the library lists, in its order.
#[test]
fn group_returns_every_listed_field() {
    let mut opt = Optimizer::new(None).unwrap();
    let group = opt
        .add_group(&GroupConfig::new().set("amsgrad", 1.0))
        .unwrap();
    let names: Vec<String> = opt
        .group(group)
        .unwrap()
        .fields()
        .map(|(name, _)| name.to_string())
        .collect();
    let listed: Vec<String> = group_fields().into_iter().map(|f| f.name).collect();
    assert_eq!(names, listed);
}

#[test]
fn add_group_gives_unnamed_fields_their_defaults() {
    let mut opt = Optimizer::new(None).unwrap();
    let config = GroupConfig::new()
        .set("lr", 3e-4)
        .set("amsgrad", 1.0)
        .set("beta2", 0.95);
    let group = opt.add_group(&config).unwrap();
    Hyper {
        lr: 3e-4,
        beta2: 0.95,
        amsgrad: true,
        ..Hyper::ADAMW
    }
    .assert_matches("after add_group", &opt.group(group).unwrap());
}

#[test]
fn set_group_replaces_named_fields_and_keeps_the_rest() {
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&GroupConfig::new()).unwrap();
    let group = opt
        .add_group(
            &GroupConfig::new()
                .set("lr", 1e-2)
                .set("beta2", 0.95)
                .set("weight_decay", 0.0),
        )
        .unwrap();
    opt.set_group(
        group,
        &GroupConfig::new().set("lr", 5e-3).set("maximize", 1.0),
    )
    .unwrap();
    let want = Hyper {
        lr: 5e-3,
        beta2: 0.95,
        weight_decay: 0.0,
        maximize: true,
        ..Hyper::ADAMW
    };
    want.assert_matches("after set_group", &opt.group(group).unwrap());
    Hyper::ADAMW.assert_matches("the other group", &opt.group(0).unwrap());

    // An empty config changes nothing; a refused one changes nothing either, not even
    // the valid fields it names.
    opt.set_group(group, &GroupConfig::new()).unwrap();
    expect_error(
        "set_group(lr 1e-1, beta1 1.5)",
        opt.set_group(group, &GroupConfig::new().set("lr", 1e-1).set("beta1", 1.5)),
        Status::InvalidArgument,
        &["beta1"],
    );
    want.assert_matches("after refused set_groups", &opt.group(group).unwrap());
}

#[test]
fn an_unknown_name_is_refused_with_the_known_names() {
    let mut opt = Optimizer::new(None).unwrap();
    expect_error(
        "add_group(dampening)",
        opt.add_group(&GroupConfig::new().set("lr", 1e-2).set("dampening", 0.9)),
        Status::InvalidArgument,
        &["dampening", "lr", "amsgrad"],
    );
    // No group was added: the next one is group 0.
    assert_eq!(opt.add_group(&GroupConfig::new()).unwrap(), 0);
    expect_error(
        "set_group(Lr)",
        opt.set_group(0, &GroupConfig::new().set("Lr", 1e-2)),
        Status::InvalidArgument,
        &["Lr", "lr"],
    );
    expect_error(
        "add_group(NUL in a name)",
        opt.add_group(&GroupConfig::new().set("l\0r", 1e-2)),
        Status::InvalidArgument,
        &["NUL"],
    );
    Hyper::ADAMW.assert_matches("group 0", &opt.group(0).unwrap());
}

#[test]
fn a_flag_other_than_0_or_1_is_refused() {
    let mut opt = Optimizer::new(None).unwrap();
    for value in [0.5, 2.0, -1.0, f64::NAN] {
        expect_error(
            &format!("add_group(amsgrad {})", value),
            opt.add_group(&GroupConfig::new().set("amsgrad", value)),
            Status::InvalidArgument,
            &["amsgrad"],
        );
    }
}

/// amsgrad allocates max_exp_avg_sq when a param is added: it cannot change after that,
/// while lr can.
#[test]
fn a_field_fixed_with_params_cannot_change_once_the_group_holds_one() {
    let mut opt = Optimizer::new(None).unwrap();
    let group = opt.add_group(&GroupConfig::new()).unwrap();
    opt.set_group(group, &GroupConfig::new().set("amsgrad", 1.0))
        .unwrap();
    opt.add_param("w", group, &[2], vec![1.0, 2.0], None)
        .unwrap();
    expect_error(
        "set_group(amsgrad 0) with a param",
        opt.set_group(group, &GroupConfig::new().set("amsgrad", 0.0)),
        Status::State,
        &["amsgrad"],
    );
    opt.set_group(group, &GroupConfig::new().set("lr", 0.5))
        .unwrap();
    let now = opt.group(group).unwrap();
    assert_eq!((now.get("amsgrad"), now.get("lr")), (Some(1.0), Some(0.5)));
}

#[test]
fn set_replaces_an_earlier_value_of_the_same_name() {
    let config = GroupConfig::new()
        .set("lr", 1.0)
        .set("eps", 1e-6)
        .set("lr", 2.0);
    assert_eq!(config.len(), 2);
    assert_eq!(config.get("lr"), Some(2.0));
    assert_eq!(config.get("beta1"), None, "not named");
    assert_eq!(
        config,
        GroupConfig::new().set("eps", 1e-6).set("lr", 2.0),
        "equal in any order"
    );
    assert_ne!(config, GroupConfig::new().set("lr", 2.0));
    let mut opt = Optimizer::new(None).unwrap();
    let group = opt.add_group(&config).unwrap();
    assert_eq!(opt.group(group).unwrap().get("lr"), Some(2.0));
}
