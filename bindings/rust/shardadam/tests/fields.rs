//! Option structs by field name from the library's tables (`sa_struct_field`): the table
//! this crate reads, and `ParamOptions::fields`, which sets any number field of
//! `sa_param_options` by the library's name for it. The library is the reference: a named
//! field must do what its member does, and reach the library's own range checks.

use shardadam::{
    struct_fields, DType, FieldType, Master, Optimizer, ParamOptions, Status, StructKind,
};

fn bf16_param(
    opt: &mut Optimizer,
    name: &str,
    options: &ParamOptions,
) -> shardadam::Result<shardadam::Param> {
    let bits: Vec<u16> = [1.0f32, -2.0, 0.5, 3.0]
        .iter()
        .map(|v| (v.to_bits() >> 16) as u16)
        .collect();
    opt.add_param16(name, 0, DType::BFloat16, &[4], bits, Some(options))
}

fn optimizer() -> Optimizer {
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&Default::default()).unwrap();
    opt
}

#[test]
fn the_param_options_table_names_every_member_at_its_c_offset() {
    let fields = struct_fields(StructKind::ParamOptions);
    let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
    for member in [
        "grad_dtype",
        "moment_dtype",
        "master",
        "scale",
        "amax",
        "scaling",
        "margin",
        "state_placement",
    ] {
        assert!(
            names.contains(&member),
            "{} missing from {:?}",
            member,
            names
        );
    }
    let field = |name: &str| fields.iter().find(|f| f.name == name).unwrap();
    assert_eq!(field("master").field_type, FieldType::Int32);
    assert_eq!(field("grad_dtype").field_type, FieldType::DType);
    assert_eq!(field("scale").field_type, FieldType::Pointer);
    // Offsets as a C compiler lays the struct out (struct_size, two 4-byte DLDataTypes, ...).
    assert_eq!(field("grad_dtype").offset, 8);
    assert_eq!(field("moment_dtype").offset, 12);
    assert_eq!(field("master").offset, 16);
    assert_eq!(field("scale").offset, 24);
    // Every kind has a table, and the group config's names are group_fields' names.
    let group: Vec<String> = struct_fields(StructKind::GroupConfig)
        .into_iter()
        .map(|f| f.name)
        .collect();
    let hyper: Vec<String> = shardadam::group_fields()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(group, hyper);
    for kind in [
        StructKind::StepArgs,
        StructKind::OptimizerConfig,
        StructKind::ImportOptions,
    ] {
        assert!(!struct_fields(kind).is_empty(), "{:?}", kind);
    }
}

#[test]
fn a_field_set_by_name_does_what_its_member_does_and_overrides_it() {
    let by_member = ParamOptions {
        master: Master::Remainder,
        ..Default::default()
    };
    let by_name = ParamOptions {
        fields: vec![("master".into(), 3.0)],
        ..Default::default()
    }; // SA_MASTER_REMAINDER
    let overridden = ParamOptions {
        master: Master::Fp32,
        fields: vec![("master".into(), 3.0)],
        ..Default::default()
    };
    let mut keys = Vec::new();
    for options in [&by_member, &by_name, &overridden] {
        let mut opt = optimizer();
        let p = bf16_param(&mut opt, "w", options).unwrap();
        // A remainder is int16 state; a float32 master would read as float32.
        keys.push((
            opt.state_i16(p, "remainder").is_ok(),
            opt.state(p, "master").is_ok(),
        ));
    }
    assert_eq!(keys, vec![(true, false); 3]);
    // Without the name, the member's Fp32 holds.
    let mut opt = optimizer();
    let p = bf16_param(
        &mut opt,
        "w",
        &ParamOptions {
            master: Master::Fp32,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(opt.state(p, "master").is_ok());
}

#[test]
fn bad_names_types_and_values_are_refused_before_anything_is_added() {
    let cases: [(&str, f64, Status, &[&str]); 5] = [
        (
            "no_such_field",
            1.0,
            Status::InvalidArgument,
            &["no field 'no_such_field'", "margin", "master"],
        ),
        (
            "grad_dtype",
            1.0,
            Status::InvalidArgument,
            &["'grad_dtype' is not a number"],
        ),
        (
            "scale",
            0.0,
            Status::InvalidArgument,
            &["'scale' is not a number"],
        ),
        (
            "master",
            1.5,
            Status::InvalidArgument,
            &["'master' is 1.5, not an int32"],
        ),
        // In range for an int32, outside the library's rule for the field: the library says so.
        ("master", 9.0, Status::InvalidArgument, &["master is 9"]),
    ];
    for (name, value, status, words) in cases {
        let mut opt = optimizer();
        let options = ParamOptions {
            fields: vec![(name.into(), value)],
            ..Default::default()
        };
        let error = bf16_param(&mut opt, "w", &options).unwrap_err();
        assert_eq!(error.status, status, "{}: {}", name, error.message);
        for word in words {
            assert!(
                error.message.contains(word),
                "{} = {}: {:?} lacks {:?}",
                name,
                value,
                error.message,
                word
            );
        }
        assert_eq!(opt.num_params(), 0, "{}", name);
    }
}
