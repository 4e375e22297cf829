//! The dtype and param scaling tables come from the library (`sa_num_dtypes`, `sa_dtype`,
//! `sa_num_param_scalings`, `sa_param_scaling_describe`). The expected values here are
//! shardadam.h's words: its codes are DLPack's (the `sys::kDL*` constants, which the
//! layout test of shardadam-sys compares with dlpack.h's DLDataTypeCode), its roles are
//! what the header says each field takes, and the moment role is what add_param accepts.
use shardadam::{dtypes, DType, Optimizer, ParamOptions, Tensor};
use shardadam_sys as sys;
use std::ffi::CStr;

const PARAM: i32 = sys::SA_DTYPE_PARAM;
const GRAD: i32 = sys::SA_DTYPE_GRAD;
const MOMENT: i32 = sys::SA_DTYPE_MOMENT;
const STATE: i32 = sys::SA_DTYPE_STATE;
const FILE: i32 = sys::SA_DTYPE_FILE;
const BLOCK: i32 = sys::SA_DTYPE_BLOCK_MOMENT;
const SCALE: i32 = sys::SA_DTYPE_SCALE;
const SCALED: i32 = sys::SA_DTYPE_SCALED_PARAM;

/// Every dtype of the header: name, DLPack code and bits, roles, and the [`DType`] that
/// names it (this crate names every one).
///
/// Roles, from shardadam.h: params are float32, bfloat16, float16 and (with a scaling, so
/// also scaled params) float8_e4m3fn, float8_e5m2; grads float32, bfloat16, float16; moments float32,
/// bfloat16 and the block storages uint8, float8_e4m3fn; states the moments, float32 (a
/// master, block absmax) and int16 (the remainder); shard files hold the dtypes with a
/// safetensors name; scales are float32 (delayed, block128) and float8_e8m0fnu (mxfp8).
fn expected() -> Vec<(&'static str, u8, u8, i32, Option<DType>)> {
    vec![
        (
            "float32",
            sys::kDLFloat,
            32,
            PARAM | GRAD | MOMENT | STATE | FILE | SCALE,
            Some(DType::Float32),
        ),
        (
            "bfloat16",
            sys::kDLBfloat,
            16,
            PARAM | GRAD | MOMENT | STATE | FILE,
            Some(DType::BFloat16),
        ),
        (
            "float16",
            sys::kDLFloat,
            16,
            PARAM | GRAD | FILE,
            Some(DType::Float16),
        ),
        (
            "uint8",
            sys::kDLUInt,
            8,
            MOMENT | STATE | BLOCK | FILE,
            Some(DType::Uint8),
        ),
        (
            "float8_e4m3fn",
            sys::kDLFloat8_e4m3fn,
            8,
            PARAM | SCALED | MOMENT | STATE | BLOCK | FILE,
            Some(DType::Float8E4m3fn),
        ),
        (
            "float8_e5m2",
            sys::kDLFloat8_e5m2,
            8,
            PARAM | SCALED,
            Some(DType::Float8E5m2),
        ),
        (
            "float8_e8m0fnu",
            sys::kDLFloat8_e8m0fnu,
            8,
            SCALE,
            Some(DType::Float8E8m0fnu),
        ),
        ("int16", sys::kDLInt, 16, STATE | FILE, Some(DType::Int16)),
    ]
}

#[test]
fn the_dtype_table_is_the_librarys_with_dlpack_codes_and_the_headers_roles() {
    let expected = expected();
    let table = dtypes();
    assert_eq!(table.len(), expected.len(), "{:?}", table);
    for (name, code, bits, roles, dtype) in expected {
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
        assert_eq!(info.roles, roles, "roles of {}", name);
        assert_eq!(
            info.safetensors_name.is_some(),
            roles & FILE != 0,
            "safetensors name of {}",
            name
        );
        if let Some(dtype) = dtype {
            assert_eq!(dtype.name(), name);
        }
        assert!(!info.doc.is_empty(), "{} has no doc", name);
    }
}

/// A tensor reports the [`DType`] of its DLPack dtype, never another of the same width
/// (the 8-bit ones are four), and none for a dtype that no [`DType`] names.
#[test]
fn a_tensor_reports_the_dtype_of_its_dlpack_code() {
    for (name, code, bits, _, dtype) in expected() {
        let mut memory = [0u8; 8];
        let mut shape = [2i64];
        let raw = sys::DLTensor {
            data: memory.as_mut_ptr() as *mut std::os::raw::c_void,
            device: sys::DLDevice {
                device_type: sys::kDLCPU,
                device_id: 0,
            },
            ndim: 1,
            dtype: sys::DLDataType {
                code,
                bits,
                lanes: 1,
            },
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        // SAFETY: shape and memory outlive the tensor, which is only asked its dtype.
        let tensor = unsafe { Tensor::from_dl_tensor(&raw) }.unwrap();
        assert_eq!(tensor.dtype(), dtype, "a tensor of {}", name);
    }
    // kDLFloat8_e4m3fnuz (the code after kDLFloat8_e4m3fn in dlpack.h 1.x): 8 bits wide,
    // and no dtype of the library's.
    let mut shape = [1i64];
    let raw = sys::DLTensor {
        data: std::ptr::null_mut(),
        device: sys::DLDevice {
            device_type: sys::kDLCPU,
            device_id: 0,
        },
        ndim: 1,
        dtype: sys::DLDataType {
            code: sys::kDLFloat8_e4m3fn + 1,
            bits: 8,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    // SAFETY: the shape outlives the tensor, which is only asked its dtype.
    let tensor = unsafe { Tensor::from_dl_tensor(&raw) }.unwrap();
    assert_eq!(tensor.dtype(), None);
}

#[test]
fn the_moment_role_is_what_add_param_accepts() {
    for dtype in [
        DType::Float32,
        DType::BFloat16,
        DType::Float16,
        DType::Uint8,
        DType::Float8E4m3fn,
        DType::Float8E5m2,
        DType::Float8E8m0fnu,
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

/// One `sa_param_scaling_info` as owned values.
#[derive(Debug, PartialEq)]
struct Scaling {
    value: i32,
    name: String,
    block: i64,
    scale_dtype: (u8, u8),
    step_writes_scale: i32,
}

fn scaling_table() -> Vec<Scaling> {
    let n = unsafe { sys::sa_num_param_scalings() };
    (0..n)
        .map(|index| {
            let mut raw = sys::sa_param_scaling_info::default();
            let status = unsafe { sys::sa_param_scaling_describe(index, &mut raw) };
            assert_eq!(status, sys::SA_OK, "sa_param_scaling_describe({})", index);
            assert!(
                !raw.name.is_null() && !raw.doc.is_null(),
                "scaling {}",
                index
            );
            // SAFETY: on SA_OK the strings are the library's static ones.
            let (name, doc) = unsafe { (CStr::from_ptr(raw.name), CStr::from_ptr(raw.doc)) };
            assert!(!doc.to_bytes().is_empty(), "scaling {} has no doc", index);
            Scaling {
                value: raw.value,
                name: name.to_str().unwrap().to_string(),
                block: raw.block,
                scale_dtype: (raw.scale_dtype.code, raw.scale_dtype.bits),
                step_writes_scale: raw.step_writes_scale,
            }
        })
        .collect()
}

/// shardadam.h's sa_param_scaling: delayed reads a float32 scalar per tensor; mxfp8 writes
/// a float8_e8m0fnu scale per 32 elements; block128 a float32 one per 128; current and
/// current_pow2 write a float32 [scale, scale_inv] per tensor; none has no scale (float32,
/// unused).
#[test]
fn the_param_scalings_are_the_headers() {
    let f32 = (sys::kDLFloat, 32);
    let scaling = |value, name: &str, block, scale_dtype, step_writes_scale| Scaling {
        value,
        name: name.to_string(),
        block,
        scale_dtype,
        step_writes_scale,
    };
    let expected = vec![
        scaling(sys::SA_SCALING_NONE, "none", 0, f32, 0),
        scaling(sys::SA_SCALING_DELAYED, "delayed", 0, f32, 0),
        scaling(
            sys::SA_SCALING_MXFP8,
            "mxfp8",
            32,
            (sys::kDLFloat8_e8m0fnu, 8),
            1,
        ),
        scaling(sys::SA_SCALING_BLOCK128, "block128", 128, f32, 1),
        scaling(sys::SA_SCALING_CURRENT, "current", 0, f32, 1),
        scaling(sys::SA_SCALING_CURRENT_POW2, "current_pow2", 0, f32, 1),
    ];
    assert_eq!(scaling_table(), expected);
}

/// SA_DTYPE_SCALE marks exactly the scale dtypes of the scalings that have a scale.
#[test]
fn the_scale_role_is_the_scale_dtypes_of_the_scalings() {
    let scalings = scaling_table();
    for info in dtypes() {
        let is_a_scale = scalings.iter().any(|s| {
            s.value != sys::SA_SCALING_NONE && s.scale_dtype == (info.dtype.code, info.dtype.bits)
        });
        assert_eq!(
            info.roles & SCALE != 0,
            is_a_scale,
            "the scale role of {}",
            info.name
        );
    }
}
