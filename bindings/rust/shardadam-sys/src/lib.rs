//! Raw declarations of the shardadam C ABI, written by hand from
//! `include/shardadam/shardadam.h` (and the parts of `dlpack/dlpack.h` >= 1.0 it uses).
//!
//! Every item mirrors the C declaration of the same name; read the header for the contract
//! of each function. A unit test compares every struct size, field offset, constant and
//! `SA_*_INIT` default below with what a C program compiled against the header reports
//! (see `build.rs`), so the two cannot drift apart silently. One struct is not mirrored:
//! `sa_group_config`, whose fields grow with every hyperparameter the library learns; it
//! is opaque here, and groups are read and written by field name (see its doc).
//!
//! Linking: `build.rs` finds `libshardadam` through pkg-config (the `shardadam.pc` of an
//! install, whose directory `PKG_CONFIG_PATH` names), or in `SHARDADAM_LIB_DIR` when that is
//! set, and gives this crate's tests and examples an rpath to it; a crate that depends on
//! this one directly gets the same rpath for its own binaries by printing
//! `cargo:rustc-link-arg=$DEP_SHARDADAM_LINK_ARG` from its build script (see `build.rs`).
//! Use the safe crate `shardadam` unless you need the raw calls.
#![allow(non_camel_case_types, non_upper_case_globals)]
#![warn(missing_docs)]

use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

// ---- DLPack (dlpack.h >= 1.0) ----------------------------------------------------------

/// `DLPackVersion`: the DLPack ABI version a managed tensor was made with.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version; shardadam needs 1.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLDeviceType` (a C enum, `int32_t` in C++).
pub type DLDeviceType = i32;
/// `kDLCPU`: host memory.
pub const kDLCPU: DLDeviceType = 1;
/// `kDLCUDA`: CUDA device memory.
pub const kDLCUDA: DLDeviceType = 2;

/// `DLDevice`: where a tensor's memory is.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DLDevice {
    /// A `DLDeviceType`.
    pub device_type: DLDeviceType,
    /// The device ordinal (0 for the CPU).
    pub device_id: i32,
}

/// `kDLInt`: signed integer type code.
pub const kDLInt: u8 = 0;
/// `kDLUInt`: unsigned integer type code.
pub const kDLUInt: u8 = 1;
/// `kDLFloat`: IEEE float type code.
pub const kDLFloat: u8 = 2;
/// `kDLBfloat`: bfloat16 type code.
pub const kDLBfloat: u8 = 4;
/// `kDLFloat8_e4m3fn`: float8 e4m3fn (no infinities) type code.
pub const kDLFloat8_e4m3fn: u8 = 10;
/// `kDLFloat8_e5m2`: float8 e5m2 type code.
pub const kDLFloat8_e5m2: u8 = 12;
/// `kDLFloat8_e8m0fnu`: float8 e8m0fnu (a power of two) type code.
pub const kDLFloat8_e8m0fnu: u8 = 14;

/// `DLDataType`: element type as a code, a bit width and a lane count.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DLDataType {
    /// A type code (`kDLFloat`, `kDLBfloat`, `kDLInt`).
    pub code: u8,
    /// Bits per element.
    pub bits: u8,
    /// Lanes (1 for scalars; 0 in a zeroed "default" dtype of `sa_param_options`).
    pub lanes: u16,
}

/// `DLTensor`: a borrowed strided view of memory.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct DLTensor {
    /// The data pointer (plus `byte_offset`).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dims.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `[ndim]` sizes.
    pub shape: *mut i64,
    /// `[ndim]` strides in elements, or NULL for C-contiguous.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor`: the pre-1.0 owning wrapper of a `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor; called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(self_: *mut DLManagedTensor)>,
}

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1;

/// `DLManagedTensorVersioned`: the owning, versioned wrapper of a `DLTensor` (DLPack 1.x).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version the producer implements.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor; called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(self_: *mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

// ---- version, status ------------------------------------------------------------------

/// `SA_VERSION_MAJOR` of the header these declarations follow.
pub const SA_VERSION_MAJOR: i32 = 0;
/// `SA_VERSION_MINOR`.
pub const SA_VERSION_MINOR: i32 = 2;
/// `SA_VERSION_PATCH`.
pub const SA_VERSION_PATCH: i32 = 0;
/// `SA_VERSION_NUMBER`: MAJOR * 10000 + MINOR * 100 + PATCH.
pub const SA_VERSION_NUMBER: i32 =
    SA_VERSION_MAJOR * 10000 + SA_VERSION_MINOR * 100 + SA_VERSION_PATCH;
/// `SA_MAX_NDIM`: the maximum tensor rank and mesh rank.
pub const SA_MAX_NDIM: usize = 16;

/// `sa_status` (a C enum).
pub type sa_status = c_int;
/// `SA_OK`.
pub const SA_OK: sa_status = 0;
/// `SA_ERR_INVALID_ARGUMENT`.
pub const SA_ERR_INVALID_ARGUMENT: sa_status = 1;
/// `SA_ERR_UNSUPPORTED`.
pub const SA_ERR_UNSUPPORTED: sa_status = 2;
/// `SA_ERR_OUT_OF_MEMORY`.
pub const SA_ERR_OUT_OF_MEMORY: sa_status = 3;
/// `SA_ERR_DEVICE`.
pub const SA_ERR_DEVICE: sa_status = 4;
/// `SA_ERR_COMM`.
pub const SA_ERR_COMM: sa_status = 5;
/// `SA_ERR_IO`.
pub const SA_ERR_IO: sa_status = 6;
/// `SA_ERR_FORMAT`.
pub const SA_ERR_FORMAT: sa_status = 7;
/// `SA_ERR_MISMATCH`.
pub const SA_ERR_MISMATCH: sa_status = 8;
/// `SA_ERR_STATE`.
pub const SA_ERR_STATE: sa_status = 9;
/// `SA_ERR_INTERNAL`.
pub const SA_ERR_INTERNAL: sa_status = 10;

// ---- layouts --------------------------------------------------------------------------

/// `sa_placement_type` (a C enum).
pub type sa_placement_type = c_int;
/// `SA_PLACEMENT_REPLICATE`.
pub const SA_PLACEMENT_REPLICATE: sa_placement_type = 0;
/// `SA_PLACEMENT_SHARD`.
pub const SA_PLACEMENT_SHARD: sa_placement_type = 1;
/// `SA_PLACEMENT_PARTIAL`.
pub const SA_PLACEMENT_PARTIAL: sa_placement_type = 2;

/// `sa_placement`: how one mesh dim places a tensor.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct sa_placement {
    /// An `sa_placement_type`.
    pub r#type: i32,
    /// Tensor dim for `SA_PLACEMENT_SHARD` (negative counts from the end).
    pub dim: i32,
}

/// `sa_layout`: where a local shard sits in its global tensor (mesh or box form).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct sa_layout {
    /// `sizeof(sa_layout)`.
    pub struct_size: usize,
    /// Rank of the global tensor.
    pub ndim: i32,
    /// `[ndim]`.
    pub global_shape: *const i64,
    /// Mesh form: number of mesh dims.
    pub mesh_ndim: i32,
    /// Mesh form: `[mesh_ndim]` sizes.
    pub mesh_shape: *const i64,
    /// Mesh form: `[mesh_ndim]` coordinate of this rank.
    pub mesh_coord: *const i64,
    /// Mesh form: `[mesh_ndim]` placements.
    pub placements: *const sa_placement,
    /// Box form: `[ndim]`; NULL selects the mesh form.
    pub global_offset: *const i64,
}

impl Default for sa_layout {
    /// `SA_LAYOUT_INIT`.
    fn default() -> Self {
        sa_layout {
            struct_size: std::mem::size_of::<sa_layout>(),
            ndim: 0,
            global_shape: ptr::null(),
            mesh_ndim: 0,
            mesh_shape: ptr::null(),
            mesh_coord: ptr::null(),
            placements: ptr::null(),
            global_offset: ptr::null(),
        }
    }
}

// ---- optimizer ------------------------------------------------------------------------

/// `sa_optimizer`: the opaque optimizer handle.
#[repr(C)]
pub struct sa_optimizer {
    _opaque: [u8; 0],
}

/// `sa_optimizer_config`: options of `sa_optimizer_create`.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct sa_optimizer_config {
    /// `sizeof(sa_optimizer_config)`.
    pub struct_size: usize,
    /// CPU backend worker threads; 0 = one per hardware thread.
    pub num_threads: i32,
    /// CPU backend: 1 = SIMD when the CPU has FMA, 0 = scalar only.
    pub cpu_simd: i32,
}

impl Default for sa_optimizer_config {
    /// `SA_OPTIMIZER_CONFIG_INIT`.
    fn default() -> Self {
        sa_optimizer_config {
            struct_size: std::mem::size_of::<sa_optimizer_config>(),
            num_threads: 0,
            cpu_simd: 1,
        }
    }
}

/// `sa_group_config`: the hyperparameters of a param group, opaque here.
///
/// Its layout and its defaults (`SA_GROUP_CONFIG_INIT`) are deliberately not mirrored: a
/// hyperparameter added to the library would otherwise need a new field here, a new
/// default and a new layout check. Bindings read the field table instead
/// (`sa_group_config_num_fields`, `sa_group_config_field`) and pass values by name
/// (`sa_optimizer_add_group_fields`, `sa_optimizer_set_group_fields`,
/// `sa_optimizer_get_group_fields`), so every field the library knows reaches Rust with no
/// change to this crate.
///
/// The C functions that take an `sa_group_config*` (`sa_optimizer_add_group`,
/// `sa_optimizer_get_group`, `sa_optimizer_set_group`, `sa_group_config_default`) are not
/// declared: Rust cannot allocate a struct whose size it does not know, so they could only
/// be called with a pointer made by C code, and the `*_fields` functions do all they do.
/// The type itself stays: `sa_field_info::offset` is an offset into it.
#[repr(C)]
pub struct sa_group_config {
    _private: [u8; 0],
}

/// `sa_field_type` (a C enum).
pub type sa_field_type = c_int;
/// `SA_FIELD_DOUBLE`: a double.
pub const SA_FIELD_DOUBLE: sa_field_type = 0;
/// `SA_FIELD_FLAG`: an int32_t, 0 or 1.
pub const SA_FIELD_FLAG: sa_field_type = 1;
/// `SA_FIELD_INT32`: an int32_t (an enum: its valid values are [min, max]).
pub const SA_FIELD_INT32: sa_field_type = 2;
/// `SA_FIELD_POINTER`: a pointer.
pub const SA_FIELD_POINTER: sa_field_type = 3;
/// `SA_FIELD_UINT64`: a uint64_t.
pub const SA_FIELD_UINT64: sa_field_type = 4;
/// `SA_FIELD_DTYPE`: a `DLDataType`; all zero: the default.
pub const SA_FIELD_DTYPE: sa_field_type = 5;

/// `sa_struct_kind` (a C enum): the option structs `sa_struct_field` describes.
pub type sa_struct_kind = c_int;
/// `SA_STRUCT_GROUP_CONFIG`: `sa_group_config`.
pub const SA_STRUCT_GROUP_CONFIG: sa_struct_kind = 0;
/// `SA_STRUCT_STEP_ARGS`: `sa_step_args`.
pub const SA_STRUCT_STEP_ARGS: sa_struct_kind = 1;
/// `SA_STRUCT_OPTIMIZER_CONFIG`: `sa_optimizer_config`.
pub const SA_STRUCT_OPTIMIZER_CONFIG: sa_struct_kind = 2;
/// `SA_STRUCT_PARAM_OPTIONS`: `sa_param_options`.
pub const SA_STRUCT_PARAM_OPTIONS: sa_struct_kind = 3;
/// `SA_STRUCT_IMPORT_OPTIONS`: `sa_import_options`.
pub const SA_STRUCT_IMPORT_OPTIONS: sa_struct_kind = 4;

/// `sa_dtype_role`: bits of `sa_dtype_info::roles`.
pub type sa_dtype_role = i32;
/// `SA_DTYPE_PARAM`: a param's dtype.
pub const SA_DTYPE_PARAM: sa_dtype_role = 1;
/// `SA_DTYPE_GRAD`: `sa_param_options::grad_dtype`.
pub const SA_DTYPE_GRAD: sa_dtype_role = 2;
/// `SA_DTYPE_MOMENT`: `sa_param_options::moment_dtype`.
pub const SA_DTYPE_MOMENT: sa_dtype_role = 4;
/// `SA_DTYPE_STATE`: some state is stored in it.
pub const SA_DTYPE_STATE: sa_dtype_role = 8;
/// `SA_DTYPE_FILE`: shard files hold tensors of it.
pub const SA_DTYPE_FILE: sa_dtype_role = 16;
/// `SA_DTYPE_BLOCK_MOMENT`: as a moment, stored in blocks with a float32 absmax per block.
pub const SA_DTYPE_BLOCK_MOMENT: sa_dtype_role = 32;
/// `SA_DTYPE_SCALE`: the dtype of an fp8 param's scale tensor under some `sa_param_scaling`
/// (`sa_param_options::scale`).
pub const SA_DTYPE_SCALE: sa_dtype_role = 64;
/// `SA_DTYPE_SCALED_PARAM`: a param's dtype that is cast from a float32 master under a
/// scaling (`sa_param_options.scaling`): the fp8 param dtypes.
pub const SA_DTYPE_SCALED_PARAM: sa_dtype_role = 128;

/// `sa_dtype_info`: one dtype the library stores, as it defines it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sa_dtype_info {
    /// Size of this struct.
    pub struct_size: usize,
    /// Its name, as messages spell it (static): "bfloat16".
    pub name: *const c_char,
    /// Its DLPack dtype.
    pub dtype: DLDataType,
    /// `sa_dtype_role` bits.
    pub roles: i32,
    /// Its safetensors name (static), or null when shard files never hold it.
    pub safetensors_name: *const c_char,
    /// What it is (static).
    pub doc: *const c_char,
}

impl Default for sa_dtype_info {
    /// `SA_DTYPE_INFO_INIT`.
    fn default() -> Self {
        sa_dtype_info {
            struct_size: std::mem::size_of::<sa_dtype_info>(),
            name: std::ptr::null(),
            dtype: DLDataType {
                code: 0,
                bits: 0,
                lanes: 0,
            },
            roles: 0,
            safetensors_name: std::ptr::null(),
            doc: std::ptr::null(),
        }
    }
}

/// `sa_field_info`: one field of `sa_group_config` as the library defines it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sa_field_info {
    /// Size of this struct.
    pub struct_size: usize,
    /// The member's name (static).
    pub name: *const c_char,
    /// An `sa_field_type`.
    pub r#type: i32,
    /// `offsetof(sa_group_config, <name>)`.
    pub offset: usize,
    /// Its default (its value in `SA_GROUP_CONFIG_INIT`).
    pub default_value: f64,
    /// Smallest valid value.
    pub min: f64,
    /// Largest valid value (exclusive unless `max_inclusive`).
    pub max: f64,
    /// 1: `max` is valid.
    pub max_inclusive: i32,
    /// 1: cannot change once the group holds a param.
    pub fixed_with_params: i32,
    /// The valid values in words (static).
    pub rule: *const c_char,
    /// What the field does (static).
    pub doc: *const c_char,
    /// `SA_FIELD_DTYPE`: the `sa_dtype_role` its dtypes have; else 0.
    pub dtype_role: i32,
    /// `sa_group_config`'s fields: the update rules that read it, a bit
    /// (`1 << sa_update_rule`) per rule; 0 for the other structs.
    pub rules: i32,
}

impl Default for sa_field_info {
    /// `SA_FIELD_INFO_INIT`.
    fn default() -> Self {
        sa_field_info {
            struct_size: std::mem::size_of::<sa_field_info>(),
            name: std::ptr::null(),
            r#type: 0,
            offset: 0,
            default_value: 0.0,
            min: 0.0,
            max: 0.0,
            max_inclusive: 0,
            fixed_with_params: 0,
            rule: std::ptr::null(),
            doc: std::ptr::null(),
            dtype_role: 0,
            rules: 0,
        }
    }
}

/// `sa_update_rule` (a C enum): a group's update rule, its field `update_rule`.
pub type sa_update_rule = c_int;
/// `SA_RULE_ADAMW`: Adam / AdamW.
pub const SA_RULE_ADAMW: sa_update_rule = 0;
/// `SA_RULE_MUON`: Muon.
pub const SA_RULE_MUON: sa_update_rule = 1;

/// `sa_muon_lr_adjust` (a C enum): a Muon group's field `adjust_lr`.
pub type sa_muon_lr_adjust = c_int;
/// `SA_MUON_LR_ORIGINAL`: lr * sqrt(max(1, rows / cols)).
pub const SA_MUON_LR_ORIGINAL: sa_muon_lr_adjust = 0;
/// `SA_MUON_LR_MATCH_RMS_ADAMW`: lr * 0.2 * sqrt(max(rows, cols)).
pub const SA_MUON_LR_MATCH_RMS_ADAMW: sa_muon_lr_adjust = 1;

/// `sa_master_kind` (a C enum).
pub type sa_master_kind = c_int;
/// `SA_MASTER_AUTO`.
pub const SA_MASTER_AUTO: sa_master_kind = 0;
/// `SA_MASTER_NONE`.
pub const SA_MASTER_NONE: sa_master_kind = 1;
/// `SA_MASTER_FP32`.
pub const SA_MASTER_FP32: sa_master_kind = 2;
/// `SA_MASTER_REMAINDER`.
pub const SA_MASTER_REMAINDER: sa_master_kind = 3;

/// `sa_state_placement` (a C enum): where a param's optimizer state lives.
pub type sa_state_placement = c_int;
/// `SA_STATE_ON_DEVICE`: in the param's device memory (the default).
pub const SA_STATE_ON_DEVICE: sa_state_placement = 0;
/// `SA_STATE_ON_HOST`: in pinned host memory that a CUDA step reads and writes in place
/// (mapped); for a CPU param the same as `SA_STATE_ON_DEVICE`.
pub const SA_STATE_ON_HOST: sa_state_placement = 1;
/// `SA_STATE_ON_HOST_CPU_STEP`: in host memory that the CPU's threads step (the param and
/// grad come down, the param goes back up); for a CPU param the same as `SA_STATE_ON_DEVICE`.
pub const SA_STATE_ON_HOST_CPU_STEP: sa_state_placement = 2;

/// `sa_param_scaling` (a C enum): how an fp8 param is cast from its float32 master.
pub type sa_param_scaling = c_int;
/// `SA_SCALING_NONE`: not scaled (float32, bfloat16 and float16 params).
pub const SA_SCALING_NONE: sa_param_scaling = 0;
/// `SA_SCALING_DELAYED`: per tensor, with the engine's float32 scale (which the step reads).
pub const SA_SCALING_DELAYED: sa_param_scaling = 1;
/// `SA_SCALING_MXFP8`: OCP MXFP8, a float8_e8m0fnu scale per 32 elements (written by the step).
pub const SA_SCALING_MXFP8: sa_param_scaling = 2;
/// `SA_SCALING_BLOCK128`: a float32 scale_inv per 128 elements (written by the step).
pub const SA_SCALING_BLOCK128: sa_param_scaling = 3;
/// `SA_SCALING_CURRENT`: per tensor, from the whole tensor's amax at each step (reduced
/// across ranks when sharded); the step writes `[scale, scale_inv]`.
pub const SA_SCALING_CURRENT: sa_param_scaling = 4;
/// `SA_SCALING_CURRENT_POW2`: as `SA_SCALING_CURRENT`, the scale rounded down to a power of two.
pub const SA_SCALING_CURRENT_POW2: sa_param_scaling = 5;

/// `sa_param_scaling_info`: one `sa_param_scaling` as the library defines it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sa_param_scaling_info {
    /// Size of this struct.
    pub struct_size: usize,
    /// Its `sa_param_scaling` value.
    pub value: i32,
    /// Its name (static): "none", "delayed", "mxfp8", "block128", "current", "current_pow2".
    pub name: *const c_char,
    /// Elements per block along the last dim; 0: per tensor.
    pub block: i64,
    /// The dtype of `sa_param_options::scale` (none: float32, unused).
    pub scale_dtype: DLDataType,
    /// 1: the step writes the scale; 0: it reads it (or there is none).
    pub step_writes_scale: i32,
    /// What it is (static).
    pub doc: *const c_char,
}

impl Default for sa_param_scaling_info {
    /// `SA_PARAM_SCALING_INFO_INIT`.
    fn default() -> Self {
        sa_param_scaling_info {
            struct_size: std::mem::size_of::<sa_param_scaling_info>(),
            value: 0,
            name: ptr::null(),
            block: 0,
            scale_dtype: DLDataType::default(),
            step_writes_scale: 0,
            doc: ptr::null(),
        }
    }
}

/// `sa_param_options`: per-param storage choices (a zeroed dtype means the default).
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct sa_param_options {
    /// `sizeof(sa_param_options)`.
    pub struct_size: usize,
    /// float32, bfloat16 or float16; zeroed: the param's dtype (float32 for fp8 params).
    pub grad_dtype: DLDataType,
    /// float32 (zeroed), bfloat16, uint8 or float8_e4m3fn.
    pub moment_dtype: DLDataType,
    /// An `sa_master_kind` (fp8 params: AUTO or FP32).
    pub master: i32,
    /// The scale tensor of an fp8 param, as `scaling` describes it; NULL unless `scaling`
    /// is not `SA_SCALING_NONE`. On `SA_OK` the optimizer owns it (calls its deleter).
    pub scale: *mut DLManagedTensorVersioned,
    /// `SA_SCALING_DELAYED` only, optional: the float32 scalar each step writes the
    /// shard's amax into; owned like `scale`. NULL otherwise.
    pub amax: *mut DLManagedTensorVersioned,
    /// An `sa_param_scaling`: required (not NONE) for fp8 params, NONE for others.
    pub scaling: i32,
    /// `SA_SCALING_CURRENT(_POW2)` only: the scale is `(fp8_max / amax) / 2^margin`, leaving
    /// `margin` binades of headroom above the amax; 0 (the default) to 6. Others: 0.
    pub margin: i32,
    /// An `sa_state_placement`: where the param's state lives (default
    /// `SA_STATE_ON_DEVICE`).
    pub state_placement: i32,
}

impl Default for sa_param_options {
    /// `SA_PARAM_OPTIONS_INIT`.
    fn default() -> Self {
        sa_param_options {
            struct_size: std::mem::size_of::<sa_param_options>(),
            grad_dtype: DLDataType::default(),
            moment_dtype: DLDataType::default(),
            master: SA_MASTER_AUTO,
            scale: ptr::null_mut(),
            amax: ptr::null_mut(),
            scaling: SA_SCALING_NONE,
            margin: 0,
            state_placement: SA_STATE_ON_DEVICE,
        }
    }
}

/// `sa_param_info`: what shardadam knows about a param.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct sa_param_info {
    /// `sizeof(sa_param_info)`.
    pub struct_size: usize,
    /// The param's name (owned by the optimizer).
    pub name: *const c_char,
    /// Its group.
    pub group: i32,
    /// Its rank.
    pub ndim: i32,
    /// `[ndim]`.
    pub local_shape: *const i64,
    /// `[ndim]`.
    pub global_shape: *const i64,
    /// `[ndim]`.
    pub global_offset: *const i64,
    /// Local elements.
    pub numel: i64,
    /// The param's dtype.
    pub param_dtype: DLDataType,
    /// The registered grad dtype.
    pub grad_dtype: DLDataType,
    /// The moments' dtype.
    pub moment_dtype: DLDataType,
    /// Resolved `sa_master_kind` (never AUTO).
    pub master: i32,
    /// Where the param lives.
    pub device: DLDevice,
    /// Its `sa_param_scaling`.
    pub scaling: i32,
    /// Its `sa_param_options::margin`.
    pub margin: i32,
    /// Its `sa_state_placement` (CPU params: `SA_STATE_ON_DEVICE`).
    pub state_placement: i32,
}

impl Default for sa_param_info {
    /// `SA_PARAM_INFO_INIT`.
    fn default() -> Self {
        sa_param_info {
            struct_size: std::mem::size_of::<sa_param_info>(),
            name: ptr::null(),
            group: 0,
            ndim: 0,
            local_shape: ptr::null(),
            global_shape: ptr::null(),
            global_offset: ptr::null(),
            numel: 0,
            param_dtype: DLDataType::default(),
            grad_dtype: DLDataType::default(),
            moment_dtype: DLDataType::default(),
            master: 0,
            device: DLDevice {
                device_type: kDLCPU,
                device_id: 0,
            },
            scaling: SA_SCALING_NONE,
            margin: 0,
            state_placement: SA_STATE_ON_DEVICE,
        }
    }
}

/// `sa_step_args`: options of `sa_optimizer_step`.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct sa_step_args {
    /// `sizeof(sa_step_args)`.
    pub struct_size: usize,
    /// One float every grad is multiplied by (the inverse loss scale); NULL means 1.
    pub inv_grad_scale: *const f32,
    /// One float; nonzero skips the whole step. NULL: never skip.
    pub found_inf: *const f32,
    /// Host memory: receives 1 if the step was skipped, else 0. May be NULL.
    pub skipped: *mut i32,
    /// 0: no gradient norm; > 0: clip the global norm to it (INFINITY: measure only).
    pub max_grad_norm: f64,
    /// `SA_NORM_L2` or `SA_NORM_INF`.
    pub norm_type: i32,
    /// One float in the optimizer's memory that receives the global norm. May be NULL.
    pub grad_norm: *mut f32,
    /// Host memory: receives the global norm (synchronizes on CUDA). May be NULL.
    pub host_grad_norm: *mut f64,
}

/// `sa_norm_type`.
pub type sa_norm_type = c_int;
/// `SA_NO_GRAD`: the `sa_optimizer_set_grad_ptrs` entry meaning "this param has no grad"
/// (never a valid grad address).
pub const SA_NO_GRAD: *const c_void = 1 as *const c_void;

/// `SA_NORM_L2`: sqrt of the sum of squares.
pub const SA_NORM_L2: sa_norm_type = 0;
/// `SA_NORM_INF`: the largest absolute element.
pub const SA_NORM_INF: sa_norm_type = 1;

impl Default for sa_step_args {
    /// `SA_STEP_ARGS_INIT`.
    fn default() -> Self {
        sa_step_args {
            struct_size: std::mem::size_of::<sa_step_args>(),
            inv_grad_scale: ptr::null(),
            found_inf: ptr::null(),
            skipped: ptr::null_mut(),
            max_grad_norm: 0.0,
            norm_type: SA_NORM_L2,
            grad_norm: ptr::null_mut(),
            host_grad_norm: ptr::null_mut(),
        }
    }
}

// ---- communicators --------------------------------------------------------------------------

/// Opaque communicator handle.
#[repr(C)]
pub struct sa_comm {
    _private: [u8; 0],
}

/// `sa_reduce_op`.
pub type sa_reduce_op = c_int;
/// `SA_REDUCE_SUM`.
pub const SA_REDUCE_SUM: sa_reduce_op = 0;
/// `SA_REDUCE_MAX`.
pub const SA_REDUCE_MAX: sa_reduce_op = 1;

/// `sa_host_comm`: a communicator made of the caller's callbacks.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct sa_host_comm {
    /// `sizeof(sa_host_comm)`.
    pub struct_size: usize,
    /// Passed back to every callback.
    pub ctx: *mut c_void,
    /// In-place all-reduce of `count` doubles across ranks; returns 0 on success.
    pub all_reduce: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            values: *mut f64,
            count: i32,
            op: sa_reduce_op,
        ) -> c_int,
    >,
    /// Called once with ctx when the communicator is freed. May be None.
    pub release: Option<unsafe extern "C" fn(ctx: *mut c_void)>,
    /// This rank, `0 <= rank < nranks`; with `nranks` 0 (the default) neither is said.
    /// Said, each split Muon matrix is orthogonalized on one owner rank.
    pub rank: i32,
    /// The number of ranks of the transport; 0: not said.
    pub nranks: i32,
    /// With `rank` and `nranks` said, may be set: sends `send_bytes[r]` bytes to each rank
    /// `r` and receives `recv_bytes[r]` from each, the blocks in rank order (as
    /// `MPI_Alltoallv`); returns 0 on success. None: the split Muon matrices' boxes go
    /// through `all_reduce` instead.
    pub all_to_all: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            send: *const c_void,
            send_bytes: *const i64,
            recv: *mut c_void,
            recv_bytes: *const i64,
        ) -> c_int,
    >,
}

impl Default for sa_host_comm {
    /// `SA_HOST_COMM_INIT`.
    fn default() -> Self {
        sa_host_comm {
            struct_size: std::mem::size_of::<sa_host_comm>(),
            ctx: ptr::null_mut(),
            all_reduce: None,
            release: None,
            rank: 0,
            nranks: 0,
            all_to_all: None,
        }
    }
}

/// `sa_nccl_unique_id`: the 128 bytes ranks share to join one NCCL communicator.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct sa_nccl_unique_id {
    /// Opaque bytes.
    pub internal: [c_char; 128],
}

// ---- shard files ----------------------------------------------------------------------------

/// `sa_writer`: where an export's bytes go (a callback table).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct sa_writer {
    /// `sizeof(sa_writer)`.
    pub struct_size: usize,
    /// The writer's context.
    pub ctx: *mut c_void,
    /// Appends `bytes` bytes; 0 on success.
    pub write:
        Option<unsafe extern "C" fn(ctx: *mut c_void, data: *const c_void, bytes: usize) -> c_int>,
    /// Makes the blob durable and visible after the last write; 0 on success. May be NULL.
    pub commit: Option<unsafe extern "C" fn(ctx: *mut c_void) -> c_int>,
    /// Frees ctx (`sa_writer_release` calls it). May be NULL.
    pub release: Option<unsafe extern "C" fn(ctx: *mut c_void)>,
    /// Writes `bytes` bytes at `offset` of the blob, from several threads at once for
    /// disjoint ranges; 0 on success. May be NULL (the export then appends with `write`).
    pub write_at:
        Option<unsafe extern "C" fn(ctx: *mut c_void, offset: u64, data: *const c_void, bytes: usize) -> c_int>,
    /// Called once before any write with the blob's size; 0 on success. May be NULL.
    pub reserve: Option<unsafe extern "C" fn(ctx: *mut c_void, bytes: u64) -> c_int>,
}

impl Default for sa_writer {
    /// `SA_WRITER_INIT`.
    fn default() -> Self {
        sa_writer {
            struct_size: std::mem::size_of::<sa_writer>(),
            ctx: ptr::null_mut(),
            write: None,
            commit: None,
            release: None,
            write_at: None,
            reserve: None,
        }
    }
}

/// `sa_export_job`: an async export in flight (`sa_optimizer_export_async`); opaque.
#[repr(C)]
pub struct sa_export_job {
    _private: [u8; 0],
}

/// `sa_reader`: where an import's bytes come from (a size and a read at an offset).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct sa_reader {
    /// `sizeof(sa_reader)`.
    pub struct_size: usize,
    /// The reader's context.
    pub ctx: *mut c_void,
    /// Total bytes of the blob.
    pub size: u64,
    /// Reads exactly `bytes` bytes at `offset` into `dst`; 0 on success.
    pub read_at: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            offset: u64,
            dst: *mut c_void,
            bytes: usize,
        ) -> c_int,
    >,
    /// Frees ctx (`sa_reader_release` calls it). May be NULL.
    pub release: Option<unsafe extern "C" fn(ctx: *mut c_void)>,
    /// Names the blob in error messages; may be NULL.
    pub name: *const c_char,
    /// 1: `read_at` may be called from several threads at once, for any ranges in any
    /// order (an import then reads each checksum block on the thread that checks it);
    /// 0: from the importing thread only, in increasing offset order per pass.
    pub concurrent: i32,
}

impl Default for sa_reader {
    /// `SA_READER_INIT`.
    fn default() -> Self {
        sa_reader {
            struct_size: std::mem::size_of::<sa_reader>(),
            ctx: ptr::null_mut(),
            size: 0,
            read_at: None,
            release: None,
            name: ptr::null(),
            concurrent: 0,
        }
    }
}

/// `sa_import_options`: options of `sa_optimizer_import`.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct sa_import_options {
    /// `sizeof(sa_import_options)`.
    pub struct_size: usize,
    /// Bytes of the staging buffer; 0: 64 MiB.
    pub staging_bytes: u64,
    /// 1: params absent from the blobs keep their state (else an error).
    pub allow_missing: i32,
    /// 1: params in the blobs that this optimizer lacks are ignored (else an error).
    pub allow_unexpected: i32,
    /// 1 (default): restore the groups' hyperparameters and step counts.
    pub restore_groups: i32,
    /// 1: read each byte once even when the data exceed the staging; a damaged block met
    /// while copying then leaves the optimizer unusable instead of unchanged.
    pub read_once: i32,
}

impl Default for sa_import_options {
    /// `SA_IMPORT_OPTIONS_INIT`.
    fn default() -> Self {
        sa_import_options {
            struct_size: std::mem::size_of::<sa_import_options>(),
            staging_bytes: 0,
            allow_missing: 0,
            allow_unexpected: 0,
            restore_groups: 1,
            read_once: 0,
        }
    }
}

extern "C" {
    /// Version of the loaded library, as `SA_VERSION_NUMBER`.
    pub fn sa_version() -> c_int;
    /// A static line naming the version and the backends compiled in. Never NULL.
    pub fn sa_build_info() -> *const c_char;
    /// A static name for a status ("SA_ERR_MISMATCH").
    pub fn sa_status_string(status: sa_status) -> *const c_char;
    /// The message of this thread's last failed handle-less call.
    pub fn sa_last_error() -> *const c_char;

    /// Resolves a mesh-form layout to this rank's box (`ndim` entries each).
    pub fn sa_layout_local_box(
        layout: *const sa_layout,
        local_shape: *mut i64,
        global_offset: *mut i64,
    ) -> sa_status;

    /// Creates an empty optimizer (`config` may be NULL).
    pub fn sa_optimizer_create(
        config: *const sa_optimizer_config,
        out: *mut *mut sa_optimizer,
    ) -> sa_status;
    /// Destroys the optimizer, its state and (through their deleters) its param shards.
    pub fn sa_optimizer_destroy(opt: *mut sa_optimizer);
    /// The message of the last failed call on `opt` ("" if none).
    pub fn sa_optimizer_last_error(opt: *const sa_optimizer) -> *const c_char;

    /// The number of dtypes the library stores.
    pub fn sa_num_dtypes() -> i32;
    /// Describes dtype `index` (0 .. `sa_num_dtypes()`) into `*out` (`out.struct_size`
    /// must be set: use `sa_dtype_info::default()`).
    pub fn sa_dtype(index: i32, out: *mut sa_dtype_info) -> sa_status;
    /// The number of `sa_param_scaling` values.
    pub fn sa_num_param_scalings() -> i32;
    /// Describes scaling `index` (0 .. `sa_num_param_scalings()`) into `*out`
    /// (`out.struct_size` must be set: use `sa_param_scaling_info::default()`).
    pub fn sa_param_scaling_describe(index: i32, out: *mut sa_param_scaling_info) -> sa_status;

    /// The number of fields of `sa_group_config` (`struct_size` aside) the library knows.
    pub fn sa_group_config_num_fields() -> i32;
    /// Describes field `index` (0 .. `sa_group_config_num_fields()`, in struct order) into
    /// `*out` (`out.struct_size` must be set: use `sa_field_info::default()`).
    pub fn sa_group_config_field(index: i32, out: *mut sa_field_info) -> sa_status;
    /// The number of fields (struct_size aside) of the struct `kind` (an `sa_struct_kind`);
    /// 0 for a kind the library does not know.
    pub fn sa_struct_num_fields(kind: i32) -> i32;
    /// Describes field `index` of the struct `kind` into `*out` (`out.struct_size` must be
    /// set: use `sa_field_info::default()`).
    pub fn sa_struct_field(kind: i32, index: i32, out: *mut sa_field_info) -> sa_status;
    /// Fills the struct `kind` at `out` with its `SA_*_INIT` defaults, as far as its
    /// `struct_size` (its first field, which must be set) reaches.
    pub fn sa_struct_default(kind: i32, out: *mut c_void) -> sa_status;
    /// Number of groups.
    pub fn sa_optimizer_num_groups(opt: *const sa_optimizer) -> i32;
    /// Appends a group with the defaults but for the `n` named fields (`names[i]` is a
    /// field's name as `sa_group_config_field` lists it, `values[i]` its value, a flag as
    /// 0 or 1); `*group` (if not NULL) receives its index.
    pub fn sa_optimizer_add_group_fields(
        opt: *mut sa_optimizer,
        n: i32,
        names: *const *const c_char,
        values: *const f64,
        group: *mut i32,
    ) -> sa_status;
    /// Replaces the `n` named fields of a group and keeps the others.
    pub fn sa_optimizer_set_group_fields(
        opt: *mut sa_optimizer,
        group: i32,
        n: i32,
        names: *const *const c_char,
        values: *const f64,
    ) -> sa_status;
    /// Reads the `n` named fields of a group into `values[0..n)`.
    pub fn sa_optimizer_get_group_fields(
        opt: *const sa_optimizer,
        group: i32,
        n: i32,
        names: *const *const c_char,
        values: *mut f64,
    ) -> sa_status;
    /// Sets a group's learning rate.
    pub fn sa_optimizer_set_lr(opt: *mut sa_optimizer, group: i32, lr: f64) -> sa_status;
    /// Reads a group's step count.
    pub fn sa_optimizer_get_step(opt: *const sa_optimizer, group: i32, step: *mut i64)
        -> sa_status;
    /// Sets a group's step count.
    pub fn sa_optimizer_set_step(opt: *mut sa_optimizer, group: i32, step: i64) -> sa_status;

    /// Registers a local shard; on `SA_OK` the optimizer owns it (calls its deleter).
    pub fn sa_optimizer_add_param(
        opt: *mut sa_optimizer,
        name: *const c_char,
        group: i32,
        local_shard: *mut DLManagedTensorVersioned,
        layout: *const sa_layout,
        options: *const sa_param_options,
        param: *mut i64,
    ) -> sa_status;
    /// As `sa_optimizer_add_param`, for the pre-1.0 `DLManagedTensor`.
    pub fn sa_optimizer_add_param_legacy(
        opt: *mut sa_optimizer,
        name: *const c_char,
        group: i32,
        local_shard: *mut DLManagedTensor,
        layout: *const sa_layout,
        options: *const sa_param_options,
        param: *mut i64,
    ) -> sa_status;
    /// Number of params.
    pub fn sa_optimizer_num_params(opt: *const sa_optimizer) -> i64;
    /// Finds a param by name.
    pub fn sa_optimizer_find_param(
        opt: *const sa_optimizer,
        name: *const c_char,
        param: *mut i64,
    ) -> sa_status;
    /// Fills `*out` (`out.struct_size` must be set).
    pub fn sa_optimizer_param_info(
        opt: *const sa_optimizer,
        param: i64,
        out: *mut sa_param_info,
    ) -> sa_status;

    /// Per-param step counts of params `[first, first + n)` into `steps[0..n)`.
    pub fn sa_optimizer_get_param_steps(
        opt: *const sa_optimizer,
        first: i64,
        n: i64,
        steps: *mut i64,
    ) -> sa_status;
    /// Replaces the step counts of params `[first, first + n)` (all checked first).
    pub fn sa_optimizer_set_param_steps(
        opt: *mut sa_optimizer,
        first: i64,
        n: i64,
        steps: *const i64,
    ) -> sa_status;

    /// Binds the grad of one param (checked); the data pointer is kept until rebound.
    pub fn sa_optimizer_set_grad(
        opt: *mut sa_optimizer,
        param: i64,
        grad: *const DLTensor,
    ) -> sa_status;
    /// Binds the grads of all params, each checked (`n` == number of params; a NULL entry:
    /// that param has no grad). All-or-nothing.
    pub fn sa_optimizer_set_grads(
        opt: *mut sa_optimizer,
        n: i64,
        grads: *const *const DLTensor,
    ) -> sa_status;
    /// Marks one param as having no grad (later steps skip it).
    pub fn sa_optimizer_clear_grad(opt: *mut sa_optimizer, param: i64) -> sa_status;
    /// Binds the grads of all params from raw pointers (`n` == number of params;
    /// `SA_NO_GRAD`: no grad). Unchecked: the library trusts the pointers (see the header).
    pub fn sa_optimizer_set_grad_ptrs(
        opt: *mut sa_optimizer,
        n: i64,
        ptrs: *const *const c_void,
    ) -> sa_status;

    /// Runs one step over every param (`args` may be NULL; `stream` is a cudaStream_t).
    pub fn sa_optimizer_step(
        opt: *mut sa_optimizer,
        args: *const sa_step_args,
        stream: *mut c_void,
    ) -> sa_status;
    /// A partial step: `sa_optimizer_step` for the params of indices `params[0..n)` only
    /// (each at most once); the others stay as they are. Per-param step counts advance,
    /// group step counts do not; `max_grad_norm` must be 0. All checked before anything
    /// changes.
    pub fn sa_optimizer_step_params(
        opt: *mut sa_optimizer,
        n: i64,
        params: *const i64,
        args: *const sa_step_args,
        stream: *mut c_void,
    ) -> sa_status;
    /// Enqueues the upload of host-side changes (needed before replaying a captured step).
    pub fn sa_optimizer_flush(opt: *mut sa_optimizer, stream: *mut c_void) -> sa_status;

    /// Creates a communicator from host callbacks.
    pub fn sa_comm_create_host(callbacks: *const sa_host_comm, out: *mut *mut sa_comm)
        -> sa_status;
    /// Makes a new NCCL unique id (`SA_ERR_UNSUPPORTED` without NCCL).
    pub fn sa_nccl_unique_id_create(out: *mut sa_nccl_unique_id) -> sa_status;
    /// Creates an NCCL communicator (collective over `nranks` ranks).
    pub fn sa_comm_create_nccl(
        id: *const sa_nccl_unique_id,
        nranks: i32,
        rank: i32,
        device: i32,
        out: *mut *mut sa_comm,
    ) -> sa_status;
    /// Wraps the caller's `ncclComm_t` (borrowed).
    pub fn sa_comm_wrap_nccl(nccl_comm: *mut c_void, out: *mut *mut sa_comm) -> sa_status;
    /// This rank and the rank count (-1 for a host communicator).
    pub fn sa_comm_info(comm: *const sa_comm, rank: *mut i32, nranks: *mut i32) -> sa_status;
    /// Releases the caller's reference. NULL is ignored.
    pub fn sa_comm_destroy(comm: *mut sa_comm);
    /// Gives the optimizer a communicator for its steps (NULL: none).
    pub fn sa_optimizer_set_comm(opt: *mut sa_optimizer, comm: *mut sa_comm) -> sa_status;

    /// A zero-copy view of one state; the caller calls `(*out).deleter(*out)`.
    pub fn sa_optimizer_state_view(
        opt: *mut sa_optimizer,
        param: i64,
        key: *const c_char,
        out: *mut *mut DLManagedTensorVersioned,
    ) -> sa_status;

    /// A moment ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") as float32 values whatever its
    /// storage (8-bit codes decoded as shard files hold them), into `out`: float32,
    /// C-contiguous, host memory, the param's local shape. Synchronizes a device backend.
    pub fn sa_optimizer_get_moment_values(
        opt: *const sa_optimizer,
        param: i64,
        key: *const c_char,
        out: *const DLTensor,
    ) -> sa_status;

    /// Casts the fp8 params `[first, first + n)` again from their masters (after masters
    /// were written through state views); synchronizes a device backend.
    pub fn sa_optimizer_recast_params(opt: *mut sa_optimizer, first: i64, n: i64) -> sa_status;
    /// Sets the masters of params `[first, first + n)` from the params' values, as
    /// `sa_optimizer_add_param` starts them; synchronizes a device backend.
    pub fn sa_optimizer_reset_masters(opt: *mut sa_optimizer, first: i64, n: i64) -> sa_status;

    /// A writer to the file at `path` (temporary file, fsync and rename on commit).
    pub fn sa_file_writer(path: *const c_char, out: *mut sa_writer) -> sa_status;
    /// A writer into a growing memory buffer.
    pub fn sa_memory_writer(out: *mut sa_writer) -> sa_status;
    /// The bytes a memory writer holds.
    pub fn sa_memory_writer_data(
        writer: *const sa_writer,
        data: *mut *const c_void,
        size: *mut usize,
    ) -> sa_status;
    /// A reader of the file at `path`.
    pub fn sa_file_reader(path: *const c_char, out: *mut sa_reader) -> sa_status;
    /// A reader of `size` borrowed bytes at `data`.
    pub fn sa_memory_reader(data: *const c_void, size: usize, out: *mut sa_reader) -> sa_status;
    /// Calls `release(ctx)` and clears the struct.
    pub fn sa_writer_release(writer: *mut sa_writer);
    /// Calls `release(ctx)` and clears the struct.
    pub fn sa_reader_release(reader: *mut sa_reader);
    /// Writes this rank's state as one shard file through `writer`, then commits it.
    pub fn sa_optimizer_export(opt: *mut sa_optimizer, writer: *const sa_writer) -> sa_status;
    /// Starts an export of a snapshot of the state (taken now) through `writer` on a
    /// library thread; `*job` receives a handle for `sa_export_job_release`. The writer's
    /// ctx must stay valid until the job has ended; errors found before the call returns
    /// leave nothing started and `*job` NULL (detail: `sa_optimizer_last_error`).
    pub fn sa_optimizer_export_async(
        opt: *mut sa_optimizer,
        writer: *const sa_writer,
        job: *mut *mut sa_export_job,
    ) -> sa_status;
    /// Waits until the job has ended and returns its status (the same on every call).
    pub fn sa_export_job_wait(job: *mut sa_export_job) -> sa_status;
    /// Sets `*done` to 1 and returns the job's status once it has ended, else `*done` = 0
    /// and `SA_OK`. Never blocks.
    pub fn sa_export_job_poll(job: *mut sa_export_job, done: *mut i32) -> sa_status;
    /// The detail of the job's failure ("" while it runs or after success); valid until
    /// the job is released.
    pub fn sa_export_job_last_error(job: *const sa_export_job) -> *const c_char;
    /// Waits for the job to end, then frees the handle. NULL is a no-op.
    pub fn sa_export_job_release(job: *mut sa_export_job);
    /// Loads state from `n` shard files, resharding as needed.
    pub fn sa_optimizer_import(
        opt: *mut sa_optimizer,
        n: i32,
        readers: *const *const sa_reader,
        options: *const sa_import_options,
    ) -> sa_status;
    /// Describes a set of shard files as JSON (free it with `sa_free`).
    pub fn sa_inspect(
        n: i32,
        readers: *const *const sa_reader,
        verify_data: i32,
        report_json: *mut *mut c_char,
    ) -> sa_status;
    /// Frees memory shardadam allocated for the caller.
    pub fn sa_free(p: *mut c_void);
}

#[cfg(test)]
mod c_layout_tests;
