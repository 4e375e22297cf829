//! The dtype table comes from the library (`sa_num_dtypes`, `sa_dtype`): its codes are
//! DLPack's (dlpack.h's DLDataTypeCode: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLFloat8_e4m3fn 10, as
//! the DLPack specification numbers them), and its moment role is what add_param accepts.
use shardadam::{dtypes, DType, Optimizer, ParamOptions};
use shardadam_sys as sys;

#[test]
fn the_dtype_table_is_the_librarys_with_dlpack_codes() {
    let expected = [
        ("float32", 2u8, 32u8, DType::Float32),
        ("bfloat16", 4, 16, DType::BFloat16),
        ("float16", 2, 16, DType::Float16),
        ("uint8", 1, 8, DType::Uint8),
        ("float8_e4m3fn", 10, 8, DType::Float8E4m3fn),
        ("int16", 0, 16, DType::Int16),
    ];
    let table = dtypes();
    assert_eq!(table.len(), expected.len(), "{:?}", table);
    for (name, code, bits, dtype) in expected {
        let info = table
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no {}", name));
        assert_eq!(
            (info.dtype.code, info.dtype.bits, info.dtype.lanes),
            (code, bits, 1),
            "{}",
            name
        );
        assert_eq!(dtype.name(), name);
        assert!(!info.doc.is_empty(), "{} has no doc", name);
    }
}

#[test]
fn the_moment_role_is_what_add_param_accepts() {
    for dtype in [
        DType::Float32,
        DType::BFloat16,
        DType::Float16,
        DType::Uint8,
        DType::Float8E4m3fn,
        DType::Int16,
    ] {
        let info = dtypes()
            .into_iter()
            .find(|d| d.name == dtype.name())
            .unwrap();
        let mut opt = Optimizer::new(None).unwrap();
        opt.add_group(&shardadam::GroupConfig::new()).unwrap();
        let options = ParamOptions {
            moment_dtype: Some(dtype),
            ..ParamOptions::default()
        };
        let added = opt
            .add_param("w", 0, &[300], vec![0.0; 300], Some(&options))
            .is_ok();
        assert_eq!(
            added,
            info.roles & sys::SA_DTYPE_MOMENT != 0,
            "{}",
            dtype.name()
        );
    }
}
