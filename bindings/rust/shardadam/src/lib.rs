//! Fused Adam/AdamW over the local shards of globally shaped params: a safe wrapper of the
//! shardadam C library (`shardadam-sys`).
//!
//! An [`Optimizer`] owns everything it hands to the library: each param's storage (the
//! `Vec` given to [`Optimizer::add_param`] moves into it and is updated in place by every
//! step), the grad buffers [`Optimizer::set_grad`] and [`Optimizer::set_grads`] copy into,
//! and the state. Dropping it frees all of that. Every grad binding is checked by the
//! library; a param may also have no grad at a step ([`Optimizer::clear_grad`], a `None`
//! in [`Optimizer::set_grads`]), and is then skipped as torch skips a param whose `.grad`
//! is `None`, its own step count ([`Optimizer::param_steps`]) not advancing.
//! [`Optimizer::step_params`] steps a list of params only (a layer whose grads are ready),
//! their counts advancing and the others left as they are. Failures are [`Error`]s with
//! the library's [`Status`] and message.
//! [`Optimizer::save`] and [`Optimizer::load`] write and read shard files (one per rank;
//! any set of them loads onto any layout); [`Optimizer::save_async`] writes one while the
//! steps go on ([`ExportJob`]).
//!
//! Params and grads may also live in memory of the caller's, on the host or a CUDA device:
//! a [`Tensor`] describes it (a CUDA pointer through the `unsafe` [`Tensor::cuda`], any
//! DLPack tensor through [`Tensor::from_dl_tensor`] or [`Tensor::from_managed`]),
//! [`Optimizer::add_tensor`] makes it a param, and [`Optimizer::bind_grad`] /
//! [`Optimizer::bind_grads`] bind a grad's memory once, after which steps read it in place
//! and copy nothing. CUDA steps are enqueued on the caller's stream
//! ([`Optimizer::step_on`]). docs/rust.md, "The same step in CUDA device memory", walks
//! through it; docs/rust.md takes a first step from a crate of your own.
//!
//! fp8 params (float8_e4m3fn or float8_e5m2 codes, [`Tensor::from_bits8`] on the host)
//! keep a float32 master, which every step updates and then casts into the codes by the
//! param's [`Scaling`] (per-tensor delayed or current scaling, MXFP8 or 1x128 blocks; the
//! library's table: [`scalings`]). [`Optimizer::add_fp8_tensor`] takes the codes with the
//! scale (and amax) tensors that scaling names; the optimizer owns them from then on.
//!
//! A group's hyperparameters are a [`GroupConfig`] of named values; [`group_fields`] lists
//! the names, defaults and valid values the loaded library knows, so this crate spells
//! none of them.
//!
//! A step can clip the gradients by their global norm ([`StepArgs::max_grad_norm`]). Each
//! rank's optimizer holds its own shards, so the ranks agree on the norm through a
//! [`Comm`] given to [`Optimizer::set_comm`]: NCCL for CUDA params, or a closure over the
//! caller's own transport ([`Comm::host`]).
//!
//! The library is linked by `shardadam-sys`, whose `build.rs` says how it is found (through
//! pkg-config, or `SHARDADAM_LIB_DIR`) and how your binaries find it at run time.
//!
//! ```
//! use shardadam::{GroupConfig, Optimizer};
//!
//! let mut opt = Optimizer::new(None)?;
//! let group = opt.add_group(&GroupConfig::new().set("lr", 0.1))?;
//! let w = opt.add_param("w", group, &[3], vec![1.0, 2.0, 3.0], None)?;
//! opt.set_grad(w, &[0.5, -0.5, 0.0])?;
//! opt.step()?;
//! assert!(opt.param_f32(w)?[0] < 1.0);
//! # Ok::<(), shardadam::Error>(())
//! ```
#![warn(missing_docs)]

mod comm;
mod fields;
mod tensor;

pub use comm::{Comm, NcclUniqueId, ReduceOp};
use fields::OptionStruct;
pub use fields::{struct_fields, FieldType, StructField, StructKind};
use shardadam_sys as sys;
use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_char, c_void};
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use tensor::Keeper;
pub use tensor::{Device, Tensor};

/// docs/rust.md, whose Rust blocks are doctests of this crate (`cargo test --doc`): the
/// page's first step compiles and runs as the page shows it.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/rust.md")]
pub struct RustPage;

/// The version of the loaded library, as MAJOR * 10000 + MINOR * 100 + PATCH.
pub fn version() -> i32 {
    unsafe { sys::sa_version() }
}

/// The library's one-line description of its version and backends.
pub fn build_info() -> String {
    unsafe { cstr_to_string(sys::sa_build_info()) }
}

/// Copies a C string (NULL gives "").
unsafe fn cstr_to_string(s: *const c_char) -> String {
    if s.is_null() {
        String::new()
    } else {
        CStr::from_ptr(s).to_string_lossy().into_owned()
    }
}

// ---- errors ------------------------------------------------------------------------------

/// Why a call failed: the `sa_status` codes other than `SA_OK`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// A NULL, out-of-range or inconsistent argument.
    InvalidArgument,
    /// A valid request this build or backend cannot serve.
    Unsupported,
    /// An allocation failed; nothing was changed.
    OutOfMemory,
    /// The device backend reported an error.
    Device,
    /// A communicator operation failed.
    Comm,
    /// Reading or writing a blob failed.
    Io,
    /// A blob is not a valid shard file.
    Format,
    /// Data disagrees with what is registered (dtype, shape).
    Mismatch,
    /// The call is not allowed in the optimizer's current state.
    State,
    /// A bug in shardadam; please report the message.
    Internal,
    /// A code this wrapper does not know (from a newer library).
    Other(i32),
}

impl Status {
    /// The status of a C code (`None` for `SA_OK`).
    pub fn from_code(code: sys::sa_status) -> Option<Status> {
        Some(match code {
            sys::SA_OK => return None,
            sys::SA_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::SA_ERR_UNSUPPORTED => Status::Unsupported,
            sys::SA_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::SA_ERR_DEVICE => Status::Device,
            sys::SA_ERR_COMM => Status::Comm,
            sys::SA_ERR_IO => Status::Io,
            sys::SA_ERR_FORMAT => Status::Format,
            sys::SA_ERR_MISMATCH => Status::Mismatch,
            sys::SA_ERR_STATE => Status::State,
            sys::SA_ERR_INTERNAL => Status::Internal,
            other => Status::Other(other),
        })
    }

    /// The C code of the status.
    pub fn code(self) -> sys::sa_status {
        match self {
            Status::InvalidArgument => sys::SA_ERR_INVALID_ARGUMENT,
            Status::Unsupported => sys::SA_ERR_UNSUPPORTED,
            Status::OutOfMemory => sys::SA_ERR_OUT_OF_MEMORY,
            Status::Device => sys::SA_ERR_DEVICE,
            Status::Comm => sys::SA_ERR_COMM,
            Status::Io => sys::SA_ERR_IO,
            Status::Format => sys::SA_ERR_FORMAT,
            Status::Mismatch => sys::SA_ERR_MISMATCH,
            Status::State => sys::SA_ERR_STATE,
            Status::Internal => sys::SA_ERR_INTERNAL,
            Status::Other(code) => code,
        }
    }

    /// The library's name of the status, e.g. "SA_ERR_MISMATCH".
    pub fn name(self) -> String {
        unsafe { cstr_to_string(sys::sa_status_string(self.code())) }
    }
}

/// A failed call: the status and the library's message (which names the function, the
/// param, what was expected and what arrived).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// What kind of failure.
    pub status: Status,
    /// The library's message, or the wrapper's for errors it finds itself.
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

/// The result of a shardadam call.
pub type Result<T> = std::result::Result<T, Error>;

/// A C-contiguous host DLTensor of `dtype` over `data`, borrowing `shape`: for a call that
/// reads or writes it while both are alive (the library never writes the shape).
fn host_dl_tensor(data: *mut c_void, dtype: DType, shape: &[i64]) -> Result<sys::DLTensor> {
    Ok(sys::DLTensor {
        data,
        device: sys::DLDevice {
            device_type: sys::kDLCPU,
            device_id: 0,
        },
        ndim: shape.len() as i32,
        dtype: dtype.dlpack()?,
        shape: shape.as_ptr() as *mut i64,
        strides: ptr::null_mut(),
        byte_offset: 0,
    })
}

fn invalid(message: String) -> Error {
    Error {
        status: Status::InvalidArgument,
        message,
    }
}

/// The result of a handle-less call: its thread-local message is read at once, on the
/// thread that made the call.
fn handleless_result(code: sys::sa_status) -> Result<()> {
    match Status::from_code(code) {
        None => Ok(()),
        Some(status) => Err(Error {
            status,
            message: unsafe { cstr_to_string(sys::sa_last_error()) },
        }),
    }
}

// ---- dtypes, layouts, options --------------------------------------------------------------

/// An element type of a param, grad, scale or state, each by the library's name for it
/// ([`DType::name`]). Their DLPack codes come from the library's table ([`dtypes`]), not
/// from this crate, which names every dtype of that table; a tensor or state of a dtype
/// it does not name (a newer library's) has no `DType` ([`Tensor::dtype`] is `None`).
///
/// The 8-bit dtypes travel as raw codes (`u8`, [`Tensor::from_bits8`]): fp8 params
/// (float8_e4m3fn, float8_e5m2, [`Optimizer::add_fp8_tensor`]), their MXFP8 block scales
/// (float8_e8m0fnu) and the block moments (uint8, float8_e4m3fn).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    Float32,
    /// bfloat16, as raw `u16` bits.
    BFloat16,
    /// IEEE binary16, as raw `u16` bits.
    Float16,
    /// 8-bit blockwise moments (`ParamOptions::moment_dtype`).
    Uint8,
    /// float8 e4m3fn (1 sign, 4 exponent and 3 mantissa bits, no infinities), as raw `u8`
    /// codes: fp8 params ([`Optimizer::add_fp8_tensor`]), and moments with a scale per
    /// block (`ParamOptions::moment_dtype`).
    Float8E4m3fn,
    /// float8 e5m2 (1 sign, 5 exponent and 2 mantissa bits, IEEE-like), as raw `u8` codes:
    /// fp8 params ([`Optimizer::add_fp8_tensor`]).
    Float8E5m2,
    /// float8 e8m0fnu (an 8-bit power-of-two exponent, 2^(code - 127)), as raw `u8` codes:
    /// the block scales of [`Scaling::Mxfp8`].
    Float8E8m0fnu,
    /// The `int16` remainder state.
    Int16,
}

/// One dtype the library stores, as it defines it (`sa_dtype_info`).
#[derive(Clone, Debug, PartialEq)]
pub struct DTypeInfo {
    /// Its name, as the library's messages spell it ("bfloat16").
    pub name: String,
    /// Its DLPack dtype.
    pub dtype: sys::DLDataType,
    /// `sys::SA_DTYPE_*` role bits: what it may be (param, grad, moment, state, file).
    pub roles: i32,
    /// Its safetensors name ("BF16"), `None` when shard files never hold it.
    pub safetensors_name: Option<String>,
    /// What it is.
    pub doc: String,
}

/// Every dtype the loaded library stores (`sa_num_dtypes`, `sa_dtype`), read once.
pub fn dtypes() -> Vec<DTypeInfo> {
    dtype_table().to_vec()
}

fn dtype_table() -> &'static [DTypeInfo] {
    // Read once and leaked, so every caller gets a 'static slice. An AtomicPtr rather than
    // std::sync::OnceLock, which needs Rust 1.70 (rust-version is 1.63, Debian 12's):
    // threads racing through the first call may each read the table; one keeps its copy
    // and the others free theirs.
    static TABLE: AtomicPtr<Vec<DTypeInfo>> = AtomicPtr::new(ptr::null_mut());
    let table = TABLE.load(Ordering::Acquire);
    if !table.is_null() {
        // SAFETY: a non-null TABLE is a leaked Box, never freed.
        return unsafe { &*table };
    }
    let read = Box::into_raw(Box::new(read_dtype_table()));
    match TABLE.compare_exchange(ptr::null_mut(), read, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `read` is now TABLE's leaked Box.
        Ok(_) => unsafe { &*read },
        Err(first) => {
            // SAFETY: `read` came from Box::into_raw above and was not published.
            drop(unsafe { Box::from_raw(read) });
            // SAFETY: `first` is TABLE's leaked Box.
            unsafe { &*first }
        }
    }
}

/// One of the library's tables: the `n` entries that `describe(index, &mut raw)` (named
/// `what`) fills, each made a `T` by `entry`, which may read the raw entry's C strings
/// (the library's static ones, or NULL).
///
/// # Panics
///
/// If the library fails to describe an entry it counts (a bug in the library).
pub(crate) fn read_table<R: Default, T>(
    n: i32,
    what: &str,
    describe: impl Fn(i32, &mut R) -> sys::sa_status,
    entry: impl Fn(&R) -> T,
) -> Vec<T> {
    (0..n)
        .map(|index| {
            let mut raw = R::default();
            // Every index below the count is described, so a failure is the library's bug.
            if let Err(e) = handleless_result(describe(index, &mut raw)) {
                panic!("{}({}) of {}: {}", what, index, n, e);
            }
            entry(&raw)
        })
        .collect()
}

/// The library's dtypes (`sa_num_dtypes`, `sa_dtype`), read from it.
fn read_dtype_table() -> Vec<DTypeInfo> {
    let n = unsafe { sys::sa_num_dtypes() };
    read_table(
        n,
        "sa_dtype",
        |i, out| unsafe { sys::sa_dtype(i, out) },
        |raw: &sys::sa_dtype_info| {
            // SAFETY: on SA_OK the strings are the library's static ones (or NULL).
            unsafe {
                DTypeInfo {
                    name: cstr_to_string(raw.name),
                    dtype: raw.dtype,
                    roles: raw.roles,
                    safetensors_name: if raw.safetensors_name.is_null() {
                        None
                    } else {
                        Some(cstr_to_string(raw.safetensors_name))
                    },
                    doc: cstr_to_string(raw.doc),
                }
            }
        },
    )
}

impl DType {
    const ALL: [DType; 8] = [
        DType::Float32,
        DType::BFloat16,
        DType::Float16,
        DType::Uint8,
        DType::Float8E4m3fn,
        DType::Float8E5m2,
        DType::Float8E8m0fnu,
        DType::Int16,
    ];

    /// The library's name for the dtype ("float32").
    pub fn name(self) -> &'static str {
        match self {
            DType::Float32 => "float32",
            DType::BFloat16 => "bfloat16",
            DType::Float16 => "float16",
            DType::Uint8 => "uint8",
            DType::Float8E4m3fn => "float8_e4m3fn",
            DType::Float8E5m2 => "float8_e5m2",
            DType::Float8E8m0fnu => "float8_e8m0fnu",
            DType::Int16 => "int16",
        }
    }

    /// Its DLPack dtype, from the library's table; an error when the loaded library does
    /// not store it.
    fn dlpack(self) -> Result<sys::DLDataType> {
        dtype_table()
            .iter()
            .find(|d| d.name == self.name())
            .map(|d| d.dtype)
            .ok_or_else(|| Error {
                status: Status::Unsupported,
                message: format!("the loaded library does not store dtype {}", self.name()),
            })
    }

    fn from_dlpack(dtype: sys::DLDataType) -> Option<DType> {
        let info = dtype_table().iter().find(|d| d.dtype == dtype)?;
        DType::ALL.iter().copied().find(|d| d.name() == info.name)
    }
}

/// One param's grad values for [`Optimizer::set_grads`], in the param's grad dtype and
/// row-major order. `From<&[f32]>` makes the float32 case `Some(grad.into())`.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Grad<'a> {
    /// float32 values.
    F32(&'a [f32]),
    /// bfloat16 values as raw bits.
    BFloat16(&'a [u16]),
    /// float16 values as raw bits.
    Float16(&'a [u16]),
}

impl<'a> Grad<'a> {
    /// The dtype the values are in.
    pub fn dtype(self) -> DType {
        match self {
            Grad::F32(_) => DType::Float32,
            Grad::BFloat16(_) => DType::BFloat16,
            Grad::Float16(_) => DType::Float16,
        }
    }

    /// The number of values.
    pub fn len(self) -> usize {
        match self {
            Grad::F32(v) => v.len(),
            Grad::BFloat16(v) | Grad::Float16(v) => v.len(),
        }
    }

    /// Whether there are no values (the grad of an empty shard).
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// The first byte and the byte count.
    fn bytes(self) -> (*const u8, usize) {
        match self {
            Grad::F32(v) => (v.as_ptr() as *const u8, 4 * v.len()),
            Grad::BFloat16(v) | Grad::Float16(v) => (v.as_ptr() as *const u8, 2 * v.len()),
        }
    }
}

impl<'a> From<&'a [f32]> for Grad<'a> {
    fn from(values: &'a [f32]) -> Self {
        Grad::F32(values)
    }
}

impl<'a> From<&'a Vec<f32>> for Grad<'a> {
    fn from(values: &'a Vec<f32>) -> Self {
        Grad::F32(values)
    }
}

/// Widens bfloat16 bits to the f32 they stand for (exact).
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Rounds an f32 to the nearest bfloat16 (ties to even); NaNs stay NaNs.
pub fn f32_to_bf16(value: f32) -> u16 {
    let u = value.to_bits();
    if value.is_nan() {
        return ((u >> 16) as u16) | 0x40;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// How one mesh dim places a tensor.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every coordinate along the mesh dim holds the same data.
    Replicate,
    /// The tensor dim is split along the mesh dim (torch.chunk; negative counts from the end).
    Shard(i32),
    /// A pending reduction: never valid for a param.
    Partial,
}

impl Placement {
    fn raw(self) -> sys::sa_placement {
        match self {
            Placement::Replicate => sys::sa_placement {
                r#type: sys::SA_PLACEMENT_REPLICATE,
                dim: 0,
            },
            Placement::Shard(dim) => sys::sa_placement {
                r#type: sys::SA_PLACEMENT_SHARD,
                dim,
            },
            Placement::Partial => sys::sa_placement {
                r#type: sys::SA_PLACEMENT_PARTIAL,
                dim: 0,
            },
        }
    }
}

/// Where a local shard sits in its global tensor (`sa_layout`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// A device mesh, this rank's coordinate in it and one placement per mesh dim.
    /// `Shard(d)` follows torch.chunk: chunks of ceil(n / k), trailing ones smaller or empty.
    Mesh {
        /// The shape of the global tensor.
        global_shape: Vec<i64>,
        /// The mesh sizes.
        mesh_shape: Vec<i64>,
        /// This rank's coordinate.
        mesh_coord: Vec<i64>,
        /// One placement per mesh dim.
        placements: Vec<Placement>,
    },
    /// The shard is the box `[global_offset, global_offset + local shape)`.
    Box {
        /// The shape of the global tensor.
        global_shape: Vec<i64>,
        /// Where the shard starts.
        global_offset: Vec<i64>,
    },
}

impl Layout {
    /// Checks the array lengths, then calls `f` with an `sa_layout` borrowing them.
    fn with_raw<T>(&self, f: impl FnOnce(&sys::sa_layout) -> Result<T>) -> Result<T> {
        let mut raw = sys::sa_layout::default();
        match self {
            Layout::Mesh {
                global_shape,
                mesh_shape,
                mesh_coord,
                placements,
            } => {
                if mesh_coord.len() != mesh_shape.len() || placements.len() != mesh_shape.len() {
                    return Err(invalid(format!(
                        "layout: mesh_shape has {} dims, mesh_coord {} and placements {}; they must agree",
                        mesh_shape.len(),
                        mesh_coord.len(),
                        placements.len()
                    )));
                }
                let placements: Vec<sys::sa_placement> =
                    placements.iter().map(|p| p.raw()).collect();
                raw.ndim = global_shape.len() as i32;
                raw.global_shape = global_shape.as_ptr();
                raw.mesh_ndim = mesh_shape.len() as i32;
                raw.mesh_shape = mesh_shape.as_ptr();
                raw.mesh_coord = mesh_coord.as_ptr();
                raw.placements = placements.as_ptr();
                f(&raw)
            }
            Layout::Box {
                global_shape,
                global_offset,
            } => {
                if global_offset.len() != global_shape.len() {
                    return Err(invalid(format!(
                        "layout: global_offset has {} dims, global_shape {}",
                        global_offset.len(),
                        global_shape.len()
                    )));
                }
                raw.ndim = global_shape.len() as i32;
                raw.global_shape = global_shape.as_ptr();
                raw.global_offset = global_offset.as_ptr();
                f(&raw)
            }
        }
    }

    /// Resolves a mesh layout to this rank's box: (local shape, global offset).
    pub fn local_box(&self) -> Result<(Vec<i64>, Vec<i64>)> {
        if let Layout::Box { .. } = self {
            return Err(invalid(
                "local_box: a box layout already is a box".to_string(),
            ));
        }
        self.with_raw(|raw| {
            let n = raw.ndim.max(0) as usize;
            let mut local_shape = vec![0i64; n];
            let mut global_offset = vec![0i64; n];
            handleless_result(unsafe {
                sys::sa_layout_local_box(raw, local_shape.as_mut_ptr(), global_offset.as_mut_ptr())
            })?;
            Ok((local_shape, global_offset))
        })
    }
}

/// How a param keeps its full-precision value (`sa_master_kind`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Master {
    /// None for float32 params, a float32 master for 16-bit params.
    #[default]
    Auto,
    /// Update the param in its own dtype (float32 params only).
    None,
    /// Keep a float32 master copy; the param is its rounding.
    Fp32,
    /// bfloat16 params: keep the int16 low half of the float32 value.
    Remainder,
}

/// Where a param's optimizer state (master, remainder, moments, block scales) lives
/// (`sa_state_placement`, [`ParamOptions::state_placement`]). Shard files do not record it:
/// a file saved from state in one placement loads into any other.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum StatePlacement {
    /// In the param's device memory.
    #[default]
    Device,
    /// In pinned host memory the optimizer owns. A CUDA param's steps stream it through a
    /// fixed device ring over the host link (the param and grad stay on the device), so it
    /// takes no device memory of its own; its state views are host memory. A CPU param's
    /// state is host memory already: the library resolves this to [`StatePlacement::Device`].
    Host,
    /// In host memory the optimizer owns, stepped by the CPU (ZeRO-Offload's scheme): each
    /// step a CUDA param's param and grad come down into a fixed ring of pinned host buffers,
    /// the host's threads ([`Config::num_threads`]) update the state there, and the param
    /// goes back up, so no state byte crosses the host link. The step's decision and
    /// coefficients are the device's: the results are bit for bit those of the other
    /// placements. The step cannot be captured in a CUDA graph. An fp8 param's master is
    /// updated on the host and its cast is the device's. A CPU param's state is host memory
    /// already: the library resolves this to [`StatePlacement::Device`].
    HostCpuStep,
}

impl StatePlacement {
    /// The placement of an `sa_state_placement` value; `None` for a value this crate does
    /// not name.
    pub fn from_code(code: sys::sa_state_placement) -> Option<StatePlacement> {
        match code {
            sys::SA_STATE_ON_DEVICE => Some(StatePlacement::Device),
            sys::SA_STATE_ON_HOST => Some(StatePlacement::Host),
            sys::SA_STATE_ON_HOST_CPU_STEP => Some(StatePlacement::HostCpuStep),
            _ => None,
        }
    }

    /// Its `sa_state_placement` value.
    pub fn code(self) -> sys::sa_state_placement {
        match self {
            StatePlacement::Device => sys::SA_STATE_ON_DEVICE,
            StatePlacement::Host => sys::SA_STATE_ON_HOST,
            StatePlacement::HostCpuStep => sys::SA_STATE_ON_HOST_CPU_STEP,
        }
    }
}

/// How an fp8 param ([`DType::Float8E4m3fn`], [`DType::Float8E5m2`]) is cast from its
/// float32 master after each update (`sa_param_scaling`; shardadam.h states each rule,
/// and [`scalings`] lists them as the loaded library defines them: names, blocks, scale
/// dtypes). The casts round to nearest even and saturate. Every fp8 param names one
/// ([`ParamOptions::scaling`]); other params take [`Scaling::None`]. Blocks run along the
/// last dim.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum Scaling {
    /// Not scaled: float32, bfloat16 and float16 params.
    #[default]
    None,
    /// Per-tensor delayed scaling (Transformer Engine's DelayedScaling): param =
    /// fp8(master * scale) with the engine's scale, a float32 tensor of one element that
    /// every step reads (> 0 and finite when the param is added: the master starts as
    /// fp8 value / scale). The amax tensor (optional, one float32) receives max |master|
    /// of this rank's shard at every step.
    Delayed,
    /// OCP MXFP8: a power-of-two scale X per 32 elements, which the step writes into the
    /// scale tensor as float8_e8m0fnu codes (127 + log2 X; the local shape with the last
    /// dim divided by 32); param = fp8(master / X). The master starts as fp8 value * X.
    /// No amax tensor.
    Mxfp8,
    /// 1x128 blocks with float32 scales (DeepSeek-V3's weights): scale = fp8_max / amax
    /// per block, param = fp8(master * scale); the step writes each block's
    /// scale_inv = 1 / scale into the scale tensor (the local shape with the last dim
    /// divided by 128). The master starts as fp8 value * scale_inv. No amax tensor.
    Block128,
    /// Per-tensor current scaling (Transformer Engine's Float8CurrentScaling): each step
    /// takes amax = max |master| of the whole tensor (reduced across the ranks through the
    /// optimizer's communicator when the layout shards it: set it first) and writes the
    /// scale tensor, two float32s [scale, scale_inv], with scale = (fp8_max / amax) /
    /// 2^[`ParamOptions::margin`]. When the param is added the tensor holds the codes'
    /// scale_inv (element 1). The amax tensor (optional, one float32) receives the amax.
    Current,
    /// As [`Scaling::Current`], the scale rounded down to a power of two.
    CurrentPow2,
    /// A value this crate does not name (from a newer library); handed on as it is.
    Other(i32),
}

impl Scaling {
    /// The scaling of an `sa_param_scaling` value.
    pub fn from_code(code: sys::sa_param_scaling) -> Scaling {
        match code {
            sys::SA_SCALING_NONE => Scaling::None,
            sys::SA_SCALING_DELAYED => Scaling::Delayed,
            sys::SA_SCALING_MXFP8 => Scaling::Mxfp8,
            sys::SA_SCALING_BLOCK128 => Scaling::Block128,
            sys::SA_SCALING_CURRENT => Scaling::Current,
            sys::SA_SCALING_CURRENT_POW2 => Scaling::CurrentPow2,
            other => Scaling::Other(other),
        }
    }

    /// Its `sa_param_scaling` value.
    pub fn code(self) -> sys::sa_param_scaling {
        match self {
            Scaling::None => sys::SA_SCALING_NONE,
            Scaling::Delayed => sys::SA_SCALING_DELAYED,
            Scaling::Mxfp8 => sys::SA_SCALING_MXFP8,
            Scaling::Block128 => sys::SA_SCALING_BLOCK128,
            Scaling::Current => sys::SA_SCALING_CURRENT,
            Scaling::CurrentPow2 => sys::SA_SCALING_CURRENT_POW2,
            Scaling::Other(code) => code,
        }
    }
}

/// One param scaling as the library defines it (`sa_param_scaling_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalingInfo {
    /// Which scaling.
    pub scaling: Scaling,
    /// Its name ("none", "delayed", "mxfp8", "block128", "current", "current_pow2").
    pub name: String,
    /// Elements per block along the last dim; 0: one scale per tensor.
    pub block: i64,
    /// The dtype of its scale tensor (float32, or float8_e8m0fnu for MXFP8; [`Scaling::None`]
    /// has none and says float32); `None` when this crate does not name it.
    pub scale_dtype: Option<DType>,
    /// The step writes the scale tensor (otherwise it reads it, or there is none).
    pub step_writes_scale: bool,
    /// What it is.
    pub doc: String,
}

/// Every param scaling the loaded library defines, in its order (`sa_num_param_scalings`,
/// `sa_param_scaling_describe`).
///
/// # Panics
///
/// If the library fails to describe a scaling it counts (a bug in the library).
pub fn scalings() -> Vec<ScalingInfo> {
    let n = unsafe { sys::sa_num_param_scalings() };
    read_table(
        n,
        "sa_param_scaling_describe",
        |i, out| unsafe { sys::sa_param_scaling_describe(i, out) },
        |raw: &sys::sa_param_scaling_info| {
            // SAFETY: on SA_OK the strings are the library's static ones (or NULL).
            unsafe {
                ScalingInfo {
                    scaling: Scaling::from_code(raw.value),
                    name: cstr_to_string(raw.name),
                    block: raw.block,
                    scale_dtype: DType::from_dlpack(raw.scale_dtype),
                    step_writes_scale: raw.step_writes_scale != 0,
                    doc: cstr_to_string(raw.doc),
                }
            }
        },
    )
}

/// Per-param choices of [`Optimizer::add_param`]. `Default` gives the library's defaults.
///
/// An fp8 param's scale and amax tensors are not options here but arguments of
/// [`Optimizer::add_fp8_tensor`]: they are owned tensors that move into the optimizer
/// with the param (or are dropped with it when the library refuses it), while options
/// are plain values a caller copies, compares and reuses across params (hence `Clone`
/// and `PartialEq`). `scaling` and `margin` are such values and stay here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParamOptions {
    /// Where the shard sits in its global tensor; `None`: not sharded.
    pub layout: Option<Layout>,
    /// The grad dtype; `None`: the param's dtype (float32 for fp8 params).
    pub grad_dtype: Option<DType>,
    /// The moments' dtype; `None`: float32.
    pub moment_dtype: Option<DType>,
    /// How the full-precision value is kept (fp8 params: `Auto` or `Fp32`, a float32
    /// master).
    pub master: Master,
    /// fp8 params: how the step casts the master into the param (required for them, with
    /// the scale tensor it names: [`Optimizer::add_fp8_tensor`]). Others: `None`.
    pub scaling: Scaling,
    /// [`Scaling::Current`] and [`Scaling::CurrentPow2`] only: the scale is
    /// `(fp8_max / amax) / 2^margin`, so values up to `2^margin * amax` still fit before
    /// they saturate; 0 (the default) to 6. The library refuses others, and a non-zero
    /// margin for any other scaling.
    pub margin: i32,
    /// Where the param's state lives; [`StatePlacement::Device`] (the default),
    /// [`StatePlacement::Host`] (pinned host memory; when the host cannot pin it the
    /// library refuses the param with [`Status::OutOfMemory`]) or
    /// [`StatePlacement::HostCpuStep`] (host memory the CPU steps).
    pub state_placement: StatePlacement,
    /// More `sa_param_options` number fields by the library's names
    /// ([`struct_fields`]`(`[`StructKind::ParamOptions`]`)`), written after the members
    /// above (a name here overrides its member). A field this crate has no member for (a
    /// newer library's) is reached this way, at the library's offset. A name the library
    /// does not know, a dtype or pointer field, or a value its C type cannot hold is
    /// [`Status::InvalidArgument`] before anything is added; the ranges are the library's.
    ///
    /// ```
    /// use shardadam::{Optimizer, ParamOptions};
    ///
    /// let mut opt = Optimizer::new(None)?;
    /// let group = opt.add_group(&Default::default())?;
    /// let options = ParamOptions { fields: vec![("margin".into(), 7.0)], ..Default::default() };
    /// let refused = opt.add_param("w", group, &[2], vec![1.0, 2.0], Some(&options)).unwrap_err();
    /// assert!(refused.message.contains("margin"), "{}", refused.message);
    /// # Ok::<(), shardadam::Error>(())
    /// ```
    pub fields: Vec<(String, f64)>,
}

impl ParamOptions {
    /// The `sa_param_options` of these choices (the layout goes separately).
    fn raw(&self) -> Result<OptionStruct> {
        let mut raw = sys::sa_param_options::default();
        if let Some(d) = self.grad_dtype {
            raw.grad_dtype = d.dlpack()?;
        }
        if let Some(d) = self.moment_dtype {
            raw.moment_dtype = d.dlpack()?;
        }
        raw.master = match self.master {
            Master::Auto => sys::SA_MASTER_AUTO,
            Master::None => sys::SA_MASTER_NONE,
            Master::Fp32 => sys::SA_MASTER_FP32,
            Master::Remainder => sys::SA_MASTER_REMAINDER,
        };
        raw.scaling = self.scaling.code();
        raw.margin = self.margin;
        raw.state_placement = self.state_placement.code();
        OptionStruct::new("add_param", StructKind::ParamOptions, &raw, &self.fields)
    }
}

/// Options of [`Optimizer::new`] (`sa_optimizer_config`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// CPU backend worker threads; 0: one per hardware thread.
    pub num_threads: i32,
    /// CPU backend: never use SIMD (the same results, slower).
    pub scalar_only: bool,
}

/// What the library says about one group hyperparameter ([`group_fields`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FieldInfo {
    /// Its name: the key of [`GroupConfig::set`] and [`GroupConfig::get`], and of the
    /// group in shard files.
    pub name: String,
    /// A flag: its values are 0 and 1.
    pub flag: bool,
    /// An integer (a flag, an enum such as `update_rule`, or a count such as `ns_steps`).
    /// Otherwise a real number.
    pub integer: bool,
    /// The update rules that read it: a bit per rule, `1 << rule` ([`RULE_ADAMW`],
    /// [`RULE_MUON`]).
    pub rules: i32,
    /// Its value in a group that does not name it.
    pub default: f64,
    /// Valid values v: `min <= v`, and `v < max`, or `v <= max` when `max_inclusive`
    /// (an exclusive infinite `max` means "finite").
    pub min: f64,
    /// See `min`.
    pub max: f64,
    /// `max` itself is valid.
    pub max_inclusive: bool,
    /// It cannot change once the group holds a param ([`Status::State`]): the params'
    /// state was allocated by it.
    pub fixed_with_params: bool,
    /// The valid values in the words of the library's error messages ("in [0, 1)").
    pub rule: String,
    /// What it does.
    pub doc: String,
}

/// The update rules a group may have: the values of its field `"update_rule"`
/// (`sa_update_rule`), as [`GroupConfig::set`] takes them. Adam / AdamW, the default.
pub const RULE_ADAMW: i32 = sys::SA_RULE_ADAMW;
/// Muon: each 2-D param (float32, or bfloat16 with a float32 master; whole or split across
/// ranks) orthogonalized by Newton-Schulz (shardadam.h spells the update and the dtypes; its
/// fields are `momentum`, `nesterov`, `ns_a`, `ns_b`, `ns_c`, `ns_steps`, `adjust_lr`).
pub const RULE_MUON: i32 = sys::SA_RULE_MUON;

/// Every group hyperparameter the loaded library knows, in its order
/// (`sa_group_config_field`). The update they drive is written in shardadam.h.
///
/// # Panics
///
/// If the library fails to describe a field it counts (a bug in the library).
pub fn group_fields() -> Vec<FieldInfo> {
    let n = unsafe { sys::sa_group_config_num_fields() };
    read_table(
        n,
        "sa_group_config_field",
        |i, out| unsafe { sys::sa_group_config_field(i, out) },
        |raw: &sys::sa_field_info| {
            // SAFETY: on SA_OK the strings are the library's static ones (or NULL).
            unsafe {
                FieldInfo {
                    name: cstr_to_string(raw.name),
                    flag: raw.r#type == sys::SA_FIELD_FLAG,
                    integer: raw.r#type == sys::SA_FIELD_FLAG || raw.r#type == sys::SA_FIELD_INT32,
                    rules: raw.rules,
                    default: raw.default_value,
                    min: raw.min,
                    max: raw.max,
                    max_inclusive: raw.max_inclusive != 0,
                    fixed_with_params: raw.fixed_with_params != 0,
                    rule: cstr_to_string(raw.rule),
                    doc: cstr_to_string(raw.doc),
                }
            }
        },
    )
}

/// Hyperparameters of a param group, by name: the names and values of
/// [`group_fields`] (a flag as 0.0 or 1.0). The wrapper knows no name itself, so every
/// field the library knows is available, and a name it does not know is the library's
/// [`Status::InvalidArgument`], whose message lists the known ones.
///
/// A config names only what it sets: [`Optimizer::add_group`] gives every other field its
/// default, [`Optimizer::set_group`] keeps every other field's current value.
///
/// ```
/// use shardadam::{GroupConfig, Optimizer};
///
/// let mut opt = Optimizer::new(None)?;
/// let adam = GroupConfig::new().set("lr", 1e-3).set("decoupled_weight_decay", 0.0);
/// let group = opt.add_group(&adam)?;
/// assert_eq!(opt.group(group)?.get("decoupled_weight_decay"), Some(0.0));
/// # Ok::<(), shardadam::Error>(())
/// ```
///
/// Two configs are equal when they name the same fields with the same values, in any order.
#[derive(Clone, Debug, Default)]
pub struct GroupConfig {
    // In the order first set; each name once (the library refuses a repeated name).
    fields: Vec<(String, f64)>,
}

impl PartialEq for GroupConfig {
    fn eq(&self, other: &GroupConfig) -> bool {
        self.len() == other.len()
            && self
                .fields()
                .all(|(name, value)| other.get(name) == Some(value))
    }
}

impl GroupConfig {
    /// A config that names no field (`Default` is the same).
    pub fn new() -> Self {
        GroupConfig::default()
    }

    /// Every field the library knows, at its default (torch.optim.AdamW's values).
    pub fn defaults() -> Self {
        GroupConfig {
            fields: group_fields()
                .into_iter()
                .map(|f| (f.name, f.default))
                .collect(),
        }
    }

    /// This config with `name` set to `value`, replacing an earlier value of `name`. The
    /// library checks the name and the value when the config is used.
    pub fn set(mut self, name: &str, value: f64) -> Self {
        match self.fields.iter_mut().find(|(n, _)| n == name) {
            Some(field) => field.1 = value,
            None => self.fields.push((name.to_string(), value)),
        }
        self
    }

    /// The value this config gives `name`, if it names it.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| *value)
    }

    /// The named fields and their values, in the order first set.
    pub fn fields(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        self.fields
            .iter()
            .map(|(name, value)| (name.as_str(), *value))
    }

    /// The number of named fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether no field is named.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The names and values as the `*_group_fields` calls take them.
    fn by_name(&self, op: &str) -> Result<(FieldNames, Vec<f64>)> {
        let names = FieldNames::new(self.fields().map(|(name, _)| name), op)?;
        Ok((names, self.fields().map(|(_, value)| value).collect()))
    }
}

/// Field names as the NUL-terminated strings the `*_group_fields` calls take.
struct FieldNames {
    strings: Vec<CString>,
    pointers: Vec<*const c_char>,
}

impl FieldNames {
    fn new<'a>(names: impl Iterator<Item = &'a str>, op: &str) -> Result<FieldNames> {
        let strings = names
            .map(|name| {
                CString::new(name).map_err(|_| {
                    invalid(format!("{}: field name {:?} contains a NUL byte", op, name))
                })
            })
            .collect::<Result<Vec<CString>>>()?;
        // The pointers stay valid while `strings` lives: a CString's bytes do not move.
        let pointers = strings.iter().map(|s| s.as_ptr()).collect();
        Ok(FieldNames { strings, pointers })
    }

    fn len(&self) -> i32 {
        self.strings.len() as i32
    }

    fn as_ptr(&self) -> *const *const c_char {
        self.pointers.as_ptr()
    }
}

/// The norm of the gradient clipping (`sa_norm_type`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum NormType {
    /// The square root of the sum of squares of all grad elements.
    #[default]
    L2,
    /// The largest absolute grad element.
    Inf,
}

impl NormType {
    fn raw(self) -> i32 {
        match self {
            NormType::L2 => sys::SA_NORM_L2,
            NormType::Inf => sys::SA_NORM_INF,
        }
    }
}

/// Options of [`Optimizer::step_with`] (`sa_step_args`). `Default` is a plain step: no loss
/// scale, no found-inf flag, no norm.
///
/// With a communicator set ([`Optimizer::set_comm`]) a step with a norm or a found-inf
/// flag is collective: every rank must call it, with the same `max_grad_norm` and
/// `norm_type`, and with a found-inf flag (`found_inf` `Some`, or
/// [`StepArgs::found_inf_at`]) on all ranks or on none.
///
/// The loss scale and the found-inf flag are host values here, which only a CPU optimizer
/// takes. A CUDA optimizer reads them from its device memory, where a GPU loss scaler
/// keeps them: give their addresses with the `unsafe` [`StepArgs::inv_grad_scale_at`] and
/// [`StepArgs::found_inf_at`], and [`StepArgs::grad_norm_at`] receives the norm there.
#[derive(Copy, Clone, Debug, PartialEq, Default)]
pub struct StepArgs {
    /// Multiplies every grad before use (the inverse loss scale); `None` means 1. CPU
    /// optimizers only (a CUDA one: [`StepArgs::inv_grad_scale_at`]).
    pub inv_grad_scale: Option<f32>,
    /// A loss scaler's flag: `Some(true)` skips the whole step (no param, state or step
    /// count changes). With a communicator the flags of all ranks are OR-reduced, so a
    /// flag on one rank skips the step everywhere; then every rank must pass `Some`. CPU
    /// optimizers only (a CUDA one: [`StepArgs::found_inf_at`]).
    pub found_inf: Option<bool>,
    /// `None`: no norm. `Some(bound)`, bound > 0: compute the norm of all grads of all ranks
    /// (after `inv_grad_scale`; a shard replicated along a mesh dim counts once) and scale
    /// every grad by `min(1, bound / (norm + 1e-6))` inside the update, as
    /// `torch.nn.utils.clip_grad_norm_` does; the grad buffers are not written.
    /// `Some(f64::INFINITY)` measures without clipping. A non-finite norm skips the step on
    /// every rank. Without a communicator the norm is this rank's own.
    pub max_grad_norm: Option<f64>,
    /// The norm `max_grad_norm` bounds.
    pub norm_type: NormType,
    /// Memory of the optimizer's that the step reads the loss scale and the found-inf flag
    /// from and writes the norm to; set through [`StepArgs::inv_grad_scale_at`],
    /// [`StepArgs::found_inf_at`] and [`StepArgs::grad_norm_at`]. `Default`: none.
    pub memory: StepMemory,
}

/// The addresses a step reads its loss scale and found-inf flag from and writes the
/// gradient norm to (`sa_step_args`' `inv_grad_scale`, `found_inf`, `grad_norm`), in the
/// optimizer's memory: device memory of a CUDA optimizer, read and written when the stream
/// reaches the step; host memory of a CPU optimizer. Only the `unsafe` methods of
/// [`StepArgs`] set them, so safe code never makes the library dereference an address.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct StepMemory {
    inv_grad_scale: *const f32,
    found_inf: *const f32,
    grad_norm: *mut f32,
}

impl Default for StepMemory {
    fn default() -> Self {
        StepMemory {
            inv_grad_scale: ptr::null(),
            found_inf: ptr::null(),
            grad_norm: ptr::null_mut(),
        }
    }
}

// SAFETY: a StepMemory is three addresses that this crate never dereferences; the library
// reads and writes them during a step, as the `unsafe` setters' callers promised, from
// whichever thread steps.
unsafe impl Send for StepMemory {}
// SAFETY: as for Send: shared references give no access to the memory.
unsafe impl Sync for StepMemory {}

impl StepArgs {
    /// The step multiplies every grad by the `f32` at `scale` (the inverse loss scale, as
    /// a GPU loss scaler keeps it) instead of by `inv_grad_scale`, which must then be
    /// `None`. NULL: no memory (the default).
    ///
    /// # Safety
    ///
    /// `scale` is NULL or points to one `f32` in the memory of the optimizer these args
    /// step (its CUDA device's memory; host memory for a CPU optimizer) that stays valid
    /// until every step given these args has run (on CUDA, until the stream has reached
    /// it).
    pub unsafe fn inv_grad_scale_at(mut self, scale: *const f32) -> Self {
        self.memory.inv_grad_scale = scale;
        self
    }

    /// The step is skipped when the `f32` at `flag` is nonzero when it runs (a loss
    /// scaler's found-inf flag), instead of by `found_inf`, which must then be `None`.
    /// The report says whether it was: on CUDA the step reads the flag back, which waits
    /// for the stream. With a communicator the flags of all ranks are OR-reduced. NULL: no
    /// memory (the default).
    ///
    /// # Safety
    ///
    /// As for [`StepArgs::inv_grad_scale_at`]: `flag` is NULL or points to one `f32` in
    /// the optimizer's memory that stays valid until every step given these args has run.
    pub unsafe fn found_inf_at(mut self, flag: *const f32) -> Self {
        self.memory.found_inf = flag;
        self
    }

    /// The step writes the gradient norm it computes (`max_grad_norm` must be `Some`) as an
    /// `f32` to `norm`, on CUDA on the stream, besides reporting it in
    /// [`StepReport::grad_norm`]. NULL: no memory (the default).
    ///
    /// # Safety
    ///
    /// `norm` is NULL or points to one writable `f32` in the optimizer's memory (as for
    /// [`StepArgs::inv_grad_scale_at`]) that stays valid, and is neither read nor written
    /// by anything else, until every step given these args has run.
    pub unsafe fn grad_norm_at(mut self, norm: *mut f32) -> Self {
        self.memory.grad_norm = norm;
        self
    }
}

/// What a step did ([`Optimizer::step_with`]).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct StepReport {
    /// The step was skipped: a found-inf flag on some rank, or a non-finite norm. No param,
    /// state or step count changed.
    pub skipped: bool,
    /// The global gradient norm, when [`StepArgs::max_grad_norm`] asked for one (NaN or
    /// infinite when a grad was; the step was then skipped). Every rank gets the same bits.
    pub grad_norm: Option<f64>,
}

/// Options of [`Optimizer::load`] (`sa_import_options`). `Default` is the library's
/// `SA_IMPORT_OPTIONS_INIT`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Params absent from the files keep their state (else an error).
    pub allow_missing: bool,
    /// Params in the files that this optimizer lacks are ignored (else an error).
    pub allow_unexpected: bool,
    /// Restore the groups' hyperparameters and step counts from the files.
    pub restore_groups: bool,
    /// Bytes of the staging buffer the data goes through; 0: the library's default (64 MiB).
    pub staging_bytes: u64,
    /// Read each byte once even when the data exceed the staging buffer: each block is
    /// checked as it is read, before it is copied, so a damaged block found after copying
    /// began leaves the optimizer unusable (until a load succeeds) instead of unchanged.
    /// For a resume into a fresh optimizer. Default: verify everything first.
    pub read_once: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        let raw = sys::sa_import_options::default();
        LoadOptions {
            allow_missing: raw.allow_missing != 0,
            allow_unexpected: raw.allow_unexpected != 0,
            restore_groups: raw.restore_groups != 0,
            staging_bytes: raw.staging_bytes,
            read_once: raw.read_once != 0,
        }
    }
}

/// A path as the NUL-terminated bytes the C ABI takes.
fn path_cstring(path: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path
        .to_str()
        .ok_or_else(|| invalid(format!("path {:?} is not UTF-8", path)))?
        .as_bytes()
        .to_vec();
    CString::new(bytes).map_err(|_| invalid(format!("path {:?} contains a NUL byte", path)))
}

/// File readers opened for an import, released when dropped (also on early returns).
struct Readers(Vec<sys::sa_reader>);

impl Drop for Readers {
    fn drop(&mut self) {
        for reader in &mut self.0 {
            unsafe { sys::sa_reader_release(reader) };
        }
    }
}

/// A save in flight ([`Optimizer::save_async`]): a thread of the library's is writing a
/// snapshot of the optimizer's state to a file (`sa_export_job`).
///
/// The file appears at [`ExportJob::path`] (written under a temporary name beside it, then
/// synced and renamed into place, replacing an older file only whole) when the job ends,
/// not before: call [`ExportJob::wait`] to know it is there, or [`ExportJob::is_done`] to
/// ask without blocking. Dropping the job waits for it to end, so the file is complete (or,
/// if the write failed, the temporary file is gone) once the drop returns; only the error
/// is lost: call `wait` to see it.
///
/// The job does not borrow the optimizer: steps, loads and hyperparameter changes may
/// follow at once, and change the state but not what the job writes. One save writes at a
/// time per optimizer: [`Optimizer::save`] or another `save_async` called while a job
/// writes first waits for it to end. Dropping the optimizer waits for it too (the job stays
/// usable after).
///
/// An `ExportJob` may be sent to another thread and waited on there (`Send`).
pub struct ExportJob {
    raw: NonNull<sys::sa_export_job>,
    // The file writer the job writes through. The library copied the struct at the call,
    // but its ctx (the temporary file) is in use on the library's thread until the job
    // ends; it is released after that (`sa_writer_release` clears it, so a second release
    // is a no-op). The library needs no stable address for the struct (it keeps a copy);
    // the box keeps it put anyway while the job moves, as the header does not promise more.
    writer: Box<sys::sa_writer>,
    path: PathBuf,
}

// SAFETY: the job handle and the file writer have no tie to the thread that made them: the
// writer's callbacks already run on the library's threads, the handle's wait and poll take
// its mutex, and its failure text is kept on the handle (not thread-local). Every method
// that touches the handle takes `&mut self` (or `self` in drop), so no two threads use it
// at once. Not `Sync`: nothing would use it (no `&self` method touches the handle).
unsafe impl Send for ExportJob {}

impl fmt::Debug for ExportJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportJob")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ExportJob {
    /// The path the file is written to (as given to [`Optimizer::save_async`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Blocks until the job has ended (`sa_export_job_wait`): `Ok` once the file is
    /// complete and renamed into place; else the error of the write (an I/O failure, a full
    /// disk), its message the job's (`sa_export_job_last_error`), with no file left behind
    /// (the temporary file is removed before this returns). Calling it again (or after
    /// [`ExportJob::is_done`] said the job ended) returns the same result without waiting.
    pub fn wait(&mut self) -> Result<()> {
        let code = unsafe { sys::sa_export_job_wait(self.raw.as_ptr()) };
        self.ended(code)
    }

    /// Whether the job has ended, without blocking (`sa_export_job_poll`): `Ok(false)`
    /// while it writes, `Ok(true)` once the file is complete, and the error
    /// [`ExportJob::wait`] would return when it ended in failure.
    pub fn is_done(&mut self) -> Result<bool> {
        let mut done = 0i32;
        let code = unsafe { sys::sa_export_job_poll(self.raw.as_ptr(), &mut done) };
        if done == 0 {
            // Not ended: SA_OK, unless the arguments were refused (never, from here).
            return handleless_result(code).map(|()| false);
        }
        self.ended(code).map(|()| true)
    }

    /// The job has ended with `code`: the writer is no longer in use, so it is released now
    /// (removing the temporary file of a failed write), and the job's message is read.
    fn ended(&mut self, code: sys::sa_status) -> Result<()> {
        unsafe { sys::sa_writer_release(&mut *self.writer) };
        match Status::from_code(code) {
            None => Ok(()),
            Some(status) => Err(Error {
                status,
                message: unsafe {
                    cstr_to_string(sys::sa_export_job_last_error(self.raw.as_ptr()))
                },
            }),
        }
    }
}

impl Drop for ExportJob {
    fn drop(&mut self) {
        // Waits for the job to end (its writer is in use until then) and frees the handle;
        // then the writer, unless wait or is_done released it already (a no-op then).
        unsafe {
            sys::sa_export_job_release(self.raw.as_ptr());
            sys::sa_writer_release(&mut *self.writer);
        }
    }
}

// ---- params -------------------------------------------------------------------------------

/// A param of one optimizer: its index, usable only with the optimizer that returned it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Param {
    index: i64,
    owner: u64,
}

impl Param {
    /// The library's index of the param (0, 1, ... in order of addition).
    pub fn index(self) -> i64 {
        self.index
    }
}

/// What the library holds for a tensor whose memory Rust describes (a tensor from a `Vec`
/// or from the caller's promise, or a legacy producer's scale tensor): the DLPack struct
/// (its address is what the library keeps) and the tensor it describes. Boxed, so none of
/// it moves; freed by `shard_deleter` when the optimizer is destroyed, which drops the
/// tensor (a legacy producer's deleter called then).
struct Shard {
    managed: sys::DLManagedTensorVersioned,
    tensor: Tensor,
}

unsafe extern "C" fn shard_deleter(managed: *mut sys::DLManagedTensorVersioned) {
    if !managed.is_null() {
        drop(Box::from_raw((*managed).manager_ctx as *mut Shard));
    }
}

impl Shard {
    /// Boxes `tensor` behind a DLPack 1.0 struct whose deleter frees the box.
    fn boxed(tensor: Tensor) -> *mut Shard {
        let raw = tensor.raw;
        let shard = Box::into_raw(Box::new(Shard {
            managed: sys::DLManagedTensorVersioned {
                version: sys::DLPackVersion { major: 1, minor: 0 },
                manager_ctx: ptr::null_mut(),
                deleter: Some(shard_deleter),
                flags: 0,
                // Its shape points into the tensor's Vec, which moves with it unmoved.
                dl_tensor: raw,
            },
            tensor,
        }));
        // SAFETY: shard was just allocated.
        unsafe { (*shard).managed.manager_ctx = shard as *mut c_void };
        shard
    }
}

/// A tensor handed to the library with a param (the param's own, its scale, its amax): a
/// [`Shard`] this crate boxed, or a producer's managed tensor as it is. Until the library
/// accepts it (`SA_OK`) this crate owns it, and [`Handed::refused`] drops it, once (a
/// [`Pending`] does that unless the library took it); once accepted ([`Handed::taken`])
/// the library owns it and calls its deleter when the optimizer is destroyed, and this
/// crate only reads the tensor's description (and, for a `Vec` it boxed, the values)
/// until then. It has no `Drop` of its own: a taken one is the library's to free.
enum Handed {
    Shard(*mut Shard),
    Producer(Tensor),
}

impl Handed {
    /// A param's tensor: a producer's (DLPack >= 1.0 or legacy) goes as it is, with its
    /// flags (the library refuses read-only params); any other is boxed.
    fn param(tensor: Tensor) -> Handed {
        match tensor.keeper {
            Keeper::Managed(_) | Keeper::Legacy(_) => Handed::Producer(tensor),
            _ => Handed::Shard(Shard::boxed(tensor)),
        }
    }

    /// A scale or amax tensor, which `sa_param_options` takes as a DLPack >= 1.0 struct
    /// only: such a producer's goes as it is; any other is boxed (a legacy producer's
    /// deleter then runs when the box is freed).
    fn versioned(tensor: Tensor) -> Handed {
        match tensor.keeper {
            Keeper::Managed(_) => Handed::Producer(tensor),
            _ => Handed::Shard(Shard::boxed(tensor)),
        }
    }

    /// The DLPack >= 1.0 struct to hand over; NULL for a legacy producer's.
    fn versioned_ptr(&self) -> *mut sys::DLManagedTensorVersioned {
        match self {
            // SAFETY: the box lives until it is refused or the library frees it.
            Handed::Shard(shard) => unsafe { ptr::addr_of_mut!((**shard).managed) },
            Handed::Producer(t) => match t.keeper {
                Keeper::Managed(m) => m.as_ptr(),
                _ => ptr::null_mut(),
            },
        }
    }

    /// A legacy producer's struct, which only a param can be
    /// (`sa_optimizer_add_param_legacy`).
    fn legacy_ptr(&self) -> Option<*mut sys::DLManagedTensor> {
        match self {
            Handed::Producer(t) => match t.keeper {
                Keeper::Legacy(m) => Some(m.as_ptr()),
                _ => None,
            },
            Handed::Shard(_) => None,
        }
    }

    /// The library refused it, so the caller (this crate) still owns it: dropped here,
    /// once (a producer's deleter called, a boxed `Vec` freed).
    fn refused(self) {
        match self {
            // SAFETY: the library did not take the box, so nothing else frees it.
            Handed::Shard(shard) => drop(unsafe { Box::from_raw(shard) }),
            Handed::Producer(t) => drop(t),
        }
    }

    /// The library took it: its deleter is the library's to call, at destroy.
    fn taken(mut self) -> Handed {
        if let Handed::Producer(t) = &mut self {
            t.release_to_library();
        }
        self
    }

    /// The tensor it describes, valid while the optimizer that took it lives.
    fn tensor(&self) -> &Tensor {
        match self {
            // SAFETY: the box lives until the optimizer is destroyed.
            Handed::Shard(shard) => unsafe { &(**shard).tensor },
            Handed::Producer(t) => t,
        }
    }

    /// [`Handed::tensor`], writable (for its `Vec`'s values only: the library holds its
    /// description, which must not change).
    fn tensor_mut(&mut self) -> &mut Tensor {
        match self {
            // SAFETY: as tensor(); &mut self excludes every other borrow.
            Handed::Shard(shard) => unsafe { &mut (**shard).tensor },
            Handed::Producer(t) => t,
        }
    }
}

/// A [`Handed`] tensor awaiting the library's answer: dropped (refused: the caller keeps
/// it, and drops it once) unless [`Pending::taken`] says the library took it. A guard, so
/// that an early return or a panic between handing and answer cannot leak or free twice.
struct Pending(Option<Handed>);

impl Pending {
    fn new(handed: Handed) -> Pending {
        Pending(Some(handed))
    }

    fn handed(&self) -> &Handed {
        self.0.as_ref().expect("a pending tensor")
    }

    /// The library took it (`SA_OK`).
    fn taken(mut self) -> Handed {
        self.0.take().expect("a pending tensor").taken()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(handed) = self.0.take() {
            handed.refused();
        }
    }
}

/// The scale tensors that go with a param ([`Optimizer::add_fp8_tensor`]; none for
/// others).
#[derive(Default)]
struct Scales {
    scale: Option<Tensor>,
    amax: Option<Tensor>,
}

/// The wrapper's record of a param.
struct ParamSlot {
    name: String,
    dtype: Option<DType>,
    shape: Vec<i64>,
    numel: usize,
    // The param's tensor, and an fp8 param's scale and amax tensors, owned by the library
    // from add_param until destroy.
    tensor: Handed,
    scale: Option<Handed>,
    amax: Option<Handed>,
    grad: Option<Vec<u32>>, // the copying bindings' buffer: 4 bytes per element fit every grad dtype
    bound: Option<Tensor>,  // the tensor bind_grad bound, kept while it is bound
}

static NEXT_OPTIMIZER_ID: AtomicU64 = AtomicU64::new(1);

/// A shardadam optimizer: groups, params and their state. It frees everything on drop.
///
/// Methods take `&mut self` where the library changes something, so the borrow checker
/// keeps param slices from living across a step. An `Optimizer` may move to another thread
/// (`Send`) but is not shared between threads (the library serializes calls per optimizer).
///
/// Its device is that of its first param: host params (`Vec`s, [`Device::Cpu`] tensors)
/// make a CPU optimizer, CUDA tensors ([`Tensor::cuda`]) a CUDA one, whose steps are
/// enqueued on a stream ([`Optimizer::step_on`]).
pub struct Optimizer {
    raw: NonNull<sys::sa_optimizer>,
    id: u64,
    params: Vec<ParamSlot>,
    device: Option<Device>,
}

// SAFETY: the library allows an optimizer to be used from any thread, one at a time; the
// raw pointers in ParamSlot point into memory only this optimizer touches, or memory the
// unsafe Tensor constructors' callers promised for use from any thread (a producer's
// deleter included).
unsafe impl Send for Optimizer {}

impl Drop for Optimizer {
    fn drop(&mut self) {
        // Frees the state and calls every shard's deleter; the grad buffers are dropped
        // with `params`, after the library has let go of them.
        unsafe { sys::sa_optimizer_destroy(self.raw.as_ptr()) };
    }
}

impl Optimizer {
    /// Creates an empty optimizer. `config` `None` gives the defaults.
    pub fn new(config: Option<&Config>) -> Result<Optimizer> {
        // The library's defaults (sa_struct_default), then the fields `config` sets.
        let mut raw_config = sys::sa_optimizer_config::default();
        handleless_result(unsafe {
            sys::sa_struct_default(
                sys::SA_STRUCT_OPTIMIZER_CONFIG,
                (&mut raw_config as *mut sys::sa_optimizer_config).cast(),
            )
        })?;
        if let Some(c) = config {
            raw_config.num_threads = c.num_threads;
            if c.scalar_only {
                raw_config.cpu_simd = 0;
            }
        }
        let mut raw = ptr::null_mut();
        handleless_result(unsafe { sys::sa_optimizer_create(&raw_config, &mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error {
            status: Status::Internal,
            message: "sa_optimizer_create returned SA_OK and no optimizer".to_string(),
        })?;
        Ok(Optimizer {
            raw,
            id: NEXT_OPTIMIZER_ID.fetch_add(1, Ordering::Relaxed),
            params: Vec::new(),
            device: None,
        })
    }

    /// The error of a call on this optimizer, with the message read at once from the handle.
    fn check(&self, code: sys::sa_status) -> Result<()> {
        match Status::from_code(code) {
            None => Ok(()),
            Some(status) => Err(Error {
                status,
                message: unsafe { cstr_to_string(sys::sa_optimizer_last_error(self.raw.as_ptr())) },
            }),
        }
    }

    fn slot(&self, param: Param) -> Result<&ParamSlot> {
        if param.owner != self.id {
            return Err(invalid(
                "the param belongs to another optimizer".to_string(),
            ));
        }
        Ok(&self.params[param.index as usize])
    }

    // ---- groups ----

    /// Appends a group and returns its index (`sa_optimizer_add_group_fields`): the fields
    /// `config` names take its values, the others their defaults. Everything is checked
    /// first; on error no group is added. Create the same groups in the same order on every
    /// rank.
    pub fn add_group(&mut self, config: &GroupConfig) -> Result<usize> {
        let (names, values) = config.by_name("add_group")?;
        let mut group = -1i32;
        self.check(unsafe {
            sys::sa_optimizer_add_group_fields(
                self.raw.as_ptr(),
                names.len(),
                names.as_ptr(),
                values.as_ptr(),
                &mut group,
            )
        })?;
        Ok(group as usize)
    }

    /// Every hyperparameter of a group, in the order of [`group_fields`]
    /// (`sa_optimizer_get_group_fields`).
    pub fn group(&self, group: usize) -> Result<GroupConfig> {
        let fields = group_fields();
        let names = FieldNames::new(fields.iter().map(|f| f.name.as_str()), "group")?;
        let mut values = vec![0.0f64; fields.len()];
        self.check(unsafe {
            sys::sa_optimizer_get_group_fields(
                self.raw.as_ptr(),
                group as i32,
                names.len(),
                names.as_ptr(),
                values.as_mut_ptr(),
            )
        })?;
        Ok(GroupConfig {
            fields: fields.into_iter().map(|f| f.name).zip(values).collect(),
        })
    }

    /// Replaces the fields of a group that `config` names and keeps the others
    /// (`sa_optimizer_set_group_fields`; all checked first, nothing changes on error).
    pub fn set_group(&mut self, group: usize, config: &GroupConfig) -> Result<()> {
        let (names, values) = config.by_name("set_group")?;
        self.check(unsafe {
            sys::sa_optimizer_set_group_fields(
                self.raw.as_ptr(),
                group as i32,
                names.len(),
                names.as_ptr(),
                values.as_ptr(),
            )
        })
    }

    /// Sets a group's learning rate.
    pub fn set_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        self.check(unsafe { sys::sa_optimizer_set_lr(self.raw.as_ptr(), group as i32, lr) })
    }

    /// A group's step count: the steps taken and not skipped.
    pub fn step_count(&self, group: usize) -> Result<i64> {
        let mut step = 0i64;
        self.check(unsafe {
            sys::sa_optimizer_get_step(self.raw.as_ptr(), group as i32, &mut step)
        })?;
        Ok(step)
    }

    /// Sets a group's step count and those of its params (e.g. when resuming).
    pub fn set_step_count(&mut self, group: usize, step: i64) -> Result<()> {
        self.check(unsafe { sys::sa_optimizer_set_step(self.raw.as_ptr(), group as i32, step) })
    }

    // ---- params ----

    /// Registers a float32 local shard named `name` in `group`. `shape` is the local shape
    /// and `data` (moved in, not copied) its values in row-major order; the optimizer
    /// updates them in place at every step. `options` `None` gives the defaults.
    /// [`Optimizer::add_tensor`] takes any memory, device memory included.
    pub fn add_param(
        &mut self,
        name: &str,
        group: usize,
        shape: &[i64],
        data: Vec<f32>,
        options: Option<&ParamOptions>,
    ) -> Result<Param> {
        check_values(name, shape, data.len())?;
        self.add_tensor(name, group, Tensor::from_f32(data, shape)?, options)
    }

    /// Registers a bfloat16 or float16 local shard from its raw bits; otherwise as
    /// [`Optimizer::add_param`]. By default a float32 master copy is kept.
    pub fn add_param16(
        &mut self,
        name: &str,
        group: usize,
        dtype: DType,
        shape: &[i64],
        bits: Vec<u16>,
        options: Option<&ParamOptions>,
    ) -> Result<Param> {
        if dtype != DType::BFloat16 && dtype != DType::Float16 {
            return Err(invalid(format!(
                "add_param16: param '{}': dtype {:?} is not 16-bit float",
                name, dtype
            )));
        }
        check_values(name, shape, bits.len())?;
        self.add_tensor(
            name,
            group,
            Tensor::from_bits16(dtype, bits, shape)?,
            options,
        )
    }

    /// Registers the local shard `tensor` named `name` in `group`
    /// (`sa_optimizer_add_param`): host or device memory, any dtype and shape the library
    /// takes (it checks them, and that all params share one device; its message says what
    /// was wrong). The optimizer keeps the tensor until it is dropped and updates its memory
    /// in place at every step; read a device param back with the device's own copy calls
    /// ([`Tensor::data_ptr`] before adding it, or the pointer you made it from). On error
    /// the tensor is dropped (a producer's deleter called).
    pub fn add_tensor(
        &mut self,
        name: &str,
        group: usize,
        tensor: Tensor,
        options: Option<&ParamOptions>,
    ) -> Result<Param> {
        self.add(name, group, tensor, Scales::default(), options)
    }

    /// Registers the fp8 local shard `tensor` (codes of [`DType::Float8E4m3fn`] or
    /// [`DType::Float8E5m2`]: [`Tensor::from_bits8`] on the host, or device memory) named
    /// `name` in `group`, cast from a float32 master after every update by
    /// `options.scaling` (required: not [`Scaling::None`]; `options.margin` for the current
    /// scalings), with the tensors that scaling names (shardadam.h, `sa_param_scaling`;
    /// [`Scaling`] says each):
    ///
    /// - `scale`: delayed, one float32 the step reads ([`Optimizer::scale_f32_mut`] writes
    ///   the engine's next one); mxfp8, float8_e8m0fnu codes of the local shape with the
    ///   last dim divided by 32; block128, float32s of the local shape with the last dim
    ///   divided by 128; current, two float32s [scale, scale_inv]. The master starts as the
    ///   codes' values dequantized by the scale as given: value / scale (delayed), value * X
    ///   (mxfp8), value * scale_inv (block128, current).
    /// - `amax`: delayed and current only, optional: one float32 the step writes.
    ///
    /// The library checks all of it (dtypes, shapes, device, the layout's blocks) and says
    /// what was wrong. Read the codes back with [`Optimizer::param_bits8`], the scales with
    /// [`Optimizer::scale_tensor`] and [`Optimizer::amax_tensor`], the master with
    /// [`Optimizer::state`] (`"master"`). Grads are float32 unless `options.grad_dtype`
    /// says otherwise.
    ///
    /// Ownership (`sa_param_options.scale`, `.amax`): the three tensors move in. When the
    /// param is added the optimizer owns them all, as it owns a param: they live, and are
    /// updated in place, until the optimizer is dropped, which drops each once (a
    /// producer's deleter called by the library). When it is refused, they are dropped
    /// before this returns, each once, and nothing is added.
    ///
    /// The scale and amax are arguments rather than [`ParamOptions`] fields because they
    /// are owned tensors that belong to this one param, while options are plain values
    /// (`Clone`, `Eq`) reused across params.
    ///
    /// ```
    /// use shardadam::{DType, GroupConfig, Optimizer, ParamOptions, Scaling, Tensor};
    ///
    /// let mut opt = Optimizer::new(None)?;
    /// let group = opt.add_group(&GroupConfig::new().set("lr", 0.1))?;
    /// let codes = Tensor::from_bits8(DType::Float8E4m3fn, vec![0x38, 0xb8], &[2])?; // 1, -1
    /// let options = ParamOptions {
    ///     scaling: Scaling::Delayed,
    ///     ..ParamOptions::default()
    /// };
    /// let scale = Tensor::from_f32(vec![2.0], &[1])?; // the master starts as [0.5, -0.5]
    /// let amax = Tensor::from_f32(vec![0.0], &[1])?;
    /// let w = opt.add_fp8_tensor("w", group, codes, scale, Some(amax), &options)?;
    /// opt.set_grad(w, &[1.0, -1.0])?;
    /// opt.step()?;
    /// let master = opt.state(w, "master")?;
    /// assert!(master[0] < 0.5 && master[1] > -0.5);
    /// assert_eq!(opt.amax_tensor(w)?.unwrap().as_f32(), Some(&[master[0].abs()][..]));
    /// # Ok::<(), shardadam::Error>(())
    /// ```
    pub fn add_fp8_tensor(
        &mut self,
        name: &str,
        group: usize,
        tensor: Tensor,
        scale: Tensor,
        amax: Option<Tensor>,
        options: &ParamOptions,
    ) -> Result<Param> {
        let scales = Scales {
            scale: Some(scale),
            amax,
        };
        self.add(name, group, tensor, scales, Some(options))
    }

    /// `sa_optimizer_add_param` of `tensor` with `scales` (`add_tensor`, `add_fp8_tensor`):
    /// on success the library owns all of them; on failure each is dropped here, once.
    fn add(
        &mut self,
        name: &str,
        group: usize,
        tensor: Tensor,
        scales: Scales,
        options: Option<&ParamOptions>,
    ) -> Result<Param> {
        let default_options = ParamOptions::default();
        let options = options.unwrap_or(&default_options);
        // (An early return before the tensors are handed drops them as Rust values.)
        let c_name = CString::new(name).map_err(|_| {
            invalid(format!(
                "add_param: param name {:?} contains a NUL byte",
                name
            ))
        })?;
        let mut raw_options = options.raw()?;
        let dtype = tensor.dtype();
        let shape = tensor.shape().to_vec();
        let numel = tensor.numel();
        let device = tensor.device();

        // Each is dropped once by its guard unless the library takes it (SA_OK).
        let handed = Pending::new(Handed::param(tensor));
        let scale = scales.scale.map(|t| Pending::new(Handed::versioned(t)));
        let amax = scales.amax.map(|t| Pending::new(Handed::versioned(t)));
        let managed = |p: &Option<Pending>| {
            p.as_ref()
                .map_or(ptr::null_mut(), |p| p.handed().versioned_ptr())
        };
        let head = raw_options.head_mut::<sys::sa_param_options>();
        head.scale = managed(&scale);
        head.amax = managed(&amax);
        let options_ptr = raw_options.as_ptr::<sys::sa_param_options>();
        let legacy = handed.handed().legacy_ptr();
        let versioned = handed.handed().versioned_ptr();

        let opt = self.raw.as_ptr();
        let mut index = -1i64;
        let call = |layout: *const sys::sa_layout, index: &mut i64| -> sys::sa_status {
            // SAFETY: every pointer is valid for the call; on SA_OK the library owns the
            // managed tensors (the Shards, or the producers').
            unsafe {
                match legacy {
                    Some(m) => sys::sa_optimizer_add_param_legacy(
                        opt,
                        c_name.as_ptr(),
                        group as i32,
                        m,
                        layout,
                        options_ptr,
                        index,
                    ),
                    None => sys::sa_optimizer_add_param(
                        opt,
                        c_name.as_ptr(),
                        group as i32,
                        versioned,
                        layout,
                        options_ptr,
                        index,
                    ),
                }
            }
        };
        let added = match &options.layout {
            None => self.check(call(ptr::null(), &mut index)),
            Some(layout) => layout.with_raw(|raw| self.check(call(raw, &mut index))),
        };
        // On failure the caller (we) keeps ownership: the guards drop each tensor once.
        added?;
        // The library owns them now (before anything that could panic).
        let (tensor, scale, amax) = (
            handed.taken(),
            scale.map(Pending::taken),
            amax.map(Pending::taken),
        );
        debug_assert_eq!(index as usize, self.params.len());
        self.device.get_or_insert(device);
        self.params.push(ParamSlot {
            name: name.to_string(),
            dtype,
            shape,
            numel,
            tensor,
            scale,
            amax,
            grad: None,
            bound: None,
        });
        Ok(Param {
            index,
            owner: self.id,
        })
    }

    /// The device of the optimizer's params (`None` before the first one is added).
    pub fn device(&self) -> Option<Device> {
        self.device
    }

    /// The name a param was registered under.
    pub fn param_name(&self, param: Param) -> Result<&str> {
        Ok(&self.slot(param)?.name)
    }

    /// The host values of a param whose `Vec` Rust owns ([`Optimizer::add_param`],
    /// [`Optimizer::add_param16`], or a [`Tensor::from_f32`] / [`Tensor::from_bits16`] /
    /// [`Tensor::from_bits8`] given to [`Optimizer::add_tensor`] or
    /// [`Optimizer::add_fp8_tensor`]).
    fn owned_values(&self, param: Param, op: &str) -> Result<&Tensor> {
        let slot = self.slot(param)?;
        if !slot.tensor.tensor().owns_values() {
            return Err(Error {
                status: Status::Unsupported,
                message: format!(
                    "{}: param '{}' lives in memory this crate does not own ({:?}); read it \
                     where it lives",
                    op,
                    slot.name,
                    self.device.unwrap_or(Device::Cpu)
                ),
            });
        }
        Ok(slot.tensor.tensor())
    }

    /// The host values of an owned param as `values` reads them (`None`: another dtype).
    fn param_values<'a, T>(
        &'a self,
        param: Param,
        op: &str,
        values: impl Fn(&'a Tensor) -> Option<&'a [T]>,
    ) -> Result<&'a [T]> {
        let t = self.owned_values(param, op)?;
        values(t).ok_or_else(|| wrong_dtype(self.slot_unchecked(param), op))
    }

    /// [`Optimizer::param_values`], writable.
    fn param_values_mut<T>(
        &mut self,
        param: Param,
        op: &str,
        values: impl Fn(&mut Tensor) -> Option<&mut [T]>,
    ) -> Result<&mut [T]> {
        self.owned_values(param, op)?;
        let slot = &mut self.params[param.index as usize];
        if values(slot.tensor.tensor_mut()).is_none() {
            return Err(wrong_dtype(slot, op));
        }
        // &mut self excludes every other borrow and every library call.
        Ok(values(slot.tensor.tensor_mut()).expect("the dtype was checked"))
    }

    /// A float32 param's values (what the last step left).
    pub fn param_f32(&self, param: Param) -> Result<&[f32]> {
        self.param_values(param, "param_f32", Tensor::as_f32)
    }

    /// A float32 param's values, writable (e.g. to load weights between steps).
    pub fn param_f32_mut(&mut self, param: Param) -> Result<&mut [f32]> {
        self.param_values_mut(param, "param_f32_mut", Tensor::as_f32_mut)
    }

    /// A bfloat16 or float16 param's raw bits.
    pub fn param_bits16(&self, param: Param) -> Result<&[u16]> {
        self.param_values(param, "param_bits16", Tensor::as_bits16)
    }

    /// An 8-bit param's codes ([`Tensor::from_bits8`] given to
    /// [`Optimizer::add_fp8_tensor`]): what the last step cast from the master.
    pub fn param_bits8(&self, param: Param) -> Result<&[u8]> {
        self.param_values(param, "param_bits8", Tensor::as_bits8)
    }

    /// An 8-bit param's codes, writable (e.g. to load fp8 weights, then
    /// [`Optimizer::reset_masters`] to start the master from them).
    pub fn param_bits8_mut(&mut self, param: Param) -> Result<&mut [u8]> {
        self.param_values_mut(param, "param_bits8_mut", Tensor::as_bits8_mut)
    }

    /// The number of params (`sa_optimizer_num_params`).
    pub fn num_params(&self) -> usize {
        unsafe { sys::sa_optimizer_num_params(self.raw.as_ptr()) }.max(0) as usize
    }

    /// A param's scaling and margin, as the library registered them
    /// (`sa_optimizer_param_info`: `scaling`, `margin`): [`Scaling::None`] and 0 for a
    /// param that is not fp8.
    pub fn param_scaling(&self, param: Param) -> Result<(Scaling, i32)> {
        self.slot(param)?;
        let mut info = sys::sa_param_info::default();
        self.check(unsafe {
            sys::sa_optimizer_param_info(self.raw.as_ptr(), param.index, &mut info)
        })?;
        Ok((Scaling::from_code(info.scaling), info.margin))
    }

    /// Where a param's state lives, as the library resolved it (`sa_optimizer_param_info`:
    /// `state_placement`): a CPU param reports [`StatePlacement::Device`] whatever it asked
    /// for. A value this crate does not name (a newer library's) is an error with
    /// [`Status::Unsupported`].
    pub fn param_state_placement(&self, param: Param) -> Result<StatePlacement> {
        let name = &self.slot(param)?.name;
        let mut info = sys::sa_param_info::default();
        self.check(unsafe {
            sys::sa_optimizer_param_info(self.raw.as_ptr(), param.index, &mut info)
        })?;
        StatePlacement::from_code(info.state_placement).ok_or_else(|| Error {
            status: Status::Unsupported,
            message: format!(
                "param_state_placement: param '{}' has state_placement {}, which this crate \
                 does not name",
                name, info.state_placement
            ),
        })
    }

    /// The scale tensor of an fp8 param ([`Optimizer::add_fp8_tensor`]; `None` for other
    /// params), which the optimizer owns: read a host one's values with
    /// [`Tensor::as_f32`] or [`Tensor::as_bits8`] (what the last step wrote, under a
    /// scaling that writes it), a device one's at [`Tensor::data_ptr`].
    pub fn scale_tensor(&self, param: Param) -> Result<Option<&Tensor>> {
        Ok(self.slot(param)?.scale.as_ref().map(Handed::tensor))
    }

    /// The amax tensor of an fp8 param, if it was given one ([`Optimizer::add_fp8_tensor`]);
    /// as [`Optimizer::scale_tensor`].
    pub fn amax_tensor(&self, param: Param) -> Result<Option<&Tensor>> {
        Ok(self.slot(param)?.amax.as_ref().map(Handed::tensor))
    }

    /// The values of an fp8 param's float32 host scale tensor ([`Tensor::from_f32`] given
    /// to [`Optimizer::add_fp8_tensor`]), writable: under [`Scaling::Delayed`] write the
    /// engine's next scale here before a step, in place.
    pub fn scale_f32_mut(&mut self, param: Param) -> Result<&mut [f32]> {
        self.scale_values_mut(param, "scale_f32_mut", "float32", "Tensor::from_f32", |t| {
            t.as_f32_mut()
        })
    }

    /// The codes of an fp8 param's 8-bit host scale tensor ([`Tensor::from_bits8`], the
    /// float8_e8m0fnu scales of [`Scaling::Mxfp8`]), writable (e.g. to load them, then
    /// [`Optimizer::reset_masters`]).
    pub fn scale_bits8_mut(&mut self, param: Param) -> Result<&mut [u8]> {
        self.scale_values_mut(
            param,
            "scale_bits8_mut",
            "8-bit",
            "Tensor::from_bits8",
            |t| t.as_bits8_mut(),
        )
    }

    /// The values of a param's host scale tensor as `values` reads them, writable; an
    /// error names the `kind` of tensor and the constructor (`made_by`) that gives one.
    fn scale_values_mut<T>(
        &mut self,
        param: Param,
        op: &str,
        kind: &str,
        made_by: &str,
        values: impl Fn(&mut Tensor) -> Option<&mut [T]>,
    ) -> Result<&mut [T]> {
        self.slot(param)?;
        let slot = &mut self.params[param.index as usize];
        let name = &slot.name;
        slot.scale
            .as_mut()
            .and_then(|h| values(h.tensor_mut()))
            .ok_or_else(|| Error {
                status: Status::State,
                message: format!(
                    "{}: param '{}' has no {} host scale tensor that this crate owns \
                     (add_fp8_tensor with {})",
                    op, name, kind, made_by
                ),
            })
    }

    fn slot_unchecked(&self, param: Param) -> &ParamSlot {
        &self.params[param.index as usize]
    }

    // ---- grads ----
    //
    // A param either has a grad at the next steps or has none: steps then skip it (its
    // values, state and step count stay, as torch skips a param whose .grad is None). A
    // param given neither since it was added fails the step with `Status::State`. Every
    // binding below goes through the library's checks (`sa_optimizer_set_grad`,
    // `sa_optimizer_set_grads`); this crate never hands raw grad pointers to
    // `sa_optimizer_set_grad_ptrs`, the C fast path that trusts its caller.
    //
    // Two ways to bind: the copying calls (set_grad, set_grad16, set_grads) copy host values
    // into a buffer the optimizer owns, for callers whose grads are fresh slices each step;
    // bind_grad and bind_grads bind a Tensor's memory itself (host or device), once, after
    // which steps read it where it is and nothing is copied.

    /// Copies float32 grads into the param's grad buffer, which stays bound for every later
    /// step until the next binding. The library checks the dtype against the registered
    /// grad dtype; on error the bound grad is unchanged.
    pub fn set_grad(&mut self, param: Param, grad: &[f32]) -> Result<()> {
        self.copy_and_bind(param, Grad::F32(grad), "set_grad")
    }

    /// [`Optimizer::set_grad`] for bfloat16 or float16 grads given as raw bits.
    pub fn set_grad16(&mut self, param: Param, dtype: DType, grad: &[u16]) -> Result<()> {
        let grad = match dtype {
            DType::BFloat16 => Grad::BFloat16(grad),
            DType::Float16 => Grad::Float16(grad),
            other => {
                return Err(invalid(format!(
                    "set_grad16: dtype {:?} is not a 16-bit float",
                    other
                )))
            }
        };
        self.copy_and_bind(param, grad, "set_grad16")
    }

    /// Binds the grads of every param in one call (`sa_optimizer_set_grads`): `grads[i]` for
    /// the param of index i, one entry per param; `None` means "this param has no grad"
    /// (steps skip it until a grad is bound again). Each grad is copied into its param's
    /// buffer and checked by the library as [`Optimizer::set_grad`] is. All-or-nothing: on
    /// error no binding and no buffer changes, and the message names the first param that
    /// failed.
    pub fn set_grads(&mut self, grads: &[Option<Grad<'_>>]) -> Result<()> {
        let mut tensors = Vec::with_capacity(grads.len());
        if grads.len() == self.params.len() {
            for (index, grad) in grads.iter().enumerate() {
                tensors.push(match grad {
                    Some(g) => Some(self.stage_grad(index, *g, "set_grads")?),
                    None => None,
                });
            }
        }
        // A list of the wrong length reaches the library with NULL entries: it refuses the
        // count before it reads any entry, and says what it expected.
        let pointers: Vec<*const sys::DLTensor> = (0..grads.len())
            .map(|i| match tensors.get(i) {
                Some(Some(t)) => t as *const sys::DLTensor,
                _ => ptr::null(),
            })
            .collect();
        self.check(unsafe {
            sys::sa_optimizer_set_grads(self.raw.as_ptr(), pointers.len() as i64, pointers.as_ptr())
        })?;
        for (index, grad) in grads.iter().enumerate() {
            if let Some(g) = grad {
                self.copy_grad(index, *g);
            }
            self.params[index].bound = None;
        }
        Ok(())
    }

    /// Marks a param as having no grad (`sa_optimizer_clear_grad`): later steps skip it,
    /// leaving its values, state and step count as they are, until a grad is bound again.
    pub fn clear_grad(&mut self, param: Param) -> Result<()> {
        self.slot(param)?;
        self.check(unsafe { sys::sa_optimizer_clear_grad(self.raw.as_ptr(), param.index) })?;
        self.params[param.index as usize].bound = None;
        Ok(())
    }

    fn copy_and_bind(&mut self, param: Param, grad: Grad<'_>, op: &str) -> Result<()> {
        self.slot(param)?;
        let index = param.index as usize;
        let tensor = self.stage_grad(index, grad, op)?;
        // Bind first (the library validates), copy after: a refused grad changes nothing.
        self.check(unsafe { sys::sa_optimizer_set_grad(self.raw.as_ptr(), param.index, &tensor) })?;
        self.copy_grad(index, grad);
        self.params[index].bound = None;
        Ok(())
    }

    /// Binds `grad`'s memory as the param's grad, zero-copy (`sa_optimizer_set_grad`): every
    /// later step reads the grads where they are, until the next binding of this param.
    /// Bind once, then write new grads into that memory before each step: on the host
    /// through [`Optimizer::grad_f32_mut`] (for a [`Tensor::from_f32`]) or the memory you
    /// made the tensor from; on a device with the device's copies or kernels, ordered
    /// before the step on its stream ([`Optimizer::grad_tensor`] gives the address back).
    ///
    /// The library checks the tensor on this call: dtype = the param's grad dtype, shape =
    /// its local shape, the optimizer's device, C-contiguous, aligned; it refuses with
    /// [`Status::Mismatch`] or [`Status::InvalidArgument`] and a message naming the param,
    /// and the previous binding stays. The optimizer keeps the tensor while it is bound
    /// (so a [`Tensor::from_f32`]'s `Vec` and a producer's managed tensor live as long as
    /// the binding); a refused tensor is dropped.
    ///
    /// ```
    /// use shardadam::{GroupConfig, Optimizer, Tensor};
    ///
    /// let mut opt = Optimizer::new(None)?;
    /// let group = opt.add_group(&GroupConfig::new().set("lr", 0.1))?;
    /// let w = opt.add_param("w", group, &[3], vec![1.0, 2.0, 3.0], None)?;
    /// opt.bind_grad(w, Tensor::from_f32(vec![0.0; 3], &[3])?)?; // once
    /// for _ in 0..3 {
    ///     opt.grad_f32_mut(w)?.copy_from_slice(&[0.5, -0.5, 0.0]); // in place, no rebinding
    ///     opt.step()?;
    /// }
    /// assert!(opt.param_f32(w)?[0] < 1.0);
    /// # Ok::<(), shardadam::Error>(())
    /// ```
    pub fn bind_grad(&mut self, param: Param, grad: Tensor) -> Result<()> {
        self.slot(param)?;
        self.check(unsafe {
            sys::sa_optimizer_set_grad(self.raw.as_ptr(), param.index, grad.as_dl_tensor())
        })?;
        // The previous tensor is dropped after the library let go of it.
        self.params[param.index as usize].bound = Some(grad);
        Ok(())
    }

    /// [`Optimizer::bind_grad`] for every param in one call (`sa_optimizer_set_grads`):
    /// `grads[i]` for the param of index i, one entry per param; `None` means "this param
    /// has no grad" (steps skip it). All-or-nothing: on error no binding changes, the
    /// message names the first param that failed, and the tensors given are dropped.
    pub fn bind_grads(&mut self, grads: Vec<Option<Tensor>>) -> Result<()> {
        let pointers: Vec<*const sys::DLTensor> = grads
            .iter()
            .map(|g| match g {
                Some(t) => t.as_dl_tensor() as *const sys::DLTensor,
                None => ptr::null(),
            })
            .collect();
        // A list of the wrong length is refused by the library, which says what it expected.
        self.check(unsafe {
            sys::sa_optimizer_set_grads(self.raw.as_ptr(), pointers.len() as i64, pointers.as_ptr())
        })?;
        for (slot, grad) in self.params.iter_mut().zip(grads) {
            slot.bound = grad;
        }
        Ok(())
    }

    /// The tensor [`Optimizer::bind_grad`] or [`Optimizer::bind_grads`] bound as the
    /// param's grad, while it is bound (`None` after a copying binding or
    /// [`Optimizer::clear_grad`]).
    pub fn grad_tensor(&self, param: Param) -> Result<Option<&Tensor>> {
        Ok(self.slot(param)?.bound.as_ref())
    }

    /// The values of the bound float32 host grad tensor ([`Tensor::from_f32`] given to
    /// [`Optimizer::bind_grad`]), writable: write the next step's grads here, in place; the
    /// step reads them with no copy and no rebinding.
    pub fn grad_f32_mut(&mut self, param: Param) -> Result<&mut [f32]> {
        self.slot(param)?;
        let slot = &mut self.params[param.index as usize];
        let name = &slot.name;
        slot.bound
            .as_mut()
            .and_then(|t| t.as_f32_mut())
            .ok_or_else(|| Error {
                status: Status::State,
                message: format!(
                    "grad_f32_mut: param '{}' has no bound float32 host grad tensor \
                     (bind one with bind_grad(param, Tensor::from_f32(..)))",
                    name
                ),
            })
    }

    /// The bits of the bound 16-bit host grad tensor ([`Tensor::from_bits16`]), writable.
    pub fn grad_bits16_mut(&mut self, param: Param) -> Result<&mut [u16]> {
        self.slot(param)?;
        let slot = &mut self.params[param.index as usize];
        let name = &slot.name;
        slot.bound
            .as_mut()
            .and_then(|t| t.as_bits16_mut())
            .ok_or_else(|| Error {
                status: Status::State,
                message: format!(
                    "grad_bits16_mut: param '{}' has no bound 16-bit host grad tensor \
                     (bind one with bind_grad(param, Tensor::from_bits16(..)))",
                    name
                ),
            })
    }

    /// The DLTensor over param `index`'s grad buffer (allocated on first use) that the
    /// library is to check and bind for `grad`. The wrapper checks only what the library
    /// cannot see: that the slice holds one value per element, as the copy needs.
    fn stage_grad(&mut self, index: usize, grad: Grad<'_>, op: &str) -> Result<sys::DLTensor> {
        let slot = &mut self.params[index];
        if grad.len() != slot.numel {
            return Err(invalid(format!(
                "{}: param '{}': grad has {} values, local shape {:?} needs {}",
                op,
                slot.name,
                grad.len(),
                slot.shape,
                slot.numel
            )));
        }
        let numel = slot.numel;
        let buffer = slot.grad.get_or_insert_with(|| vec![0u32; numel.max(1)]);
        host_dl_tensor(
            buffer.as_mut_ptr() as *mut c_void,
            grad.dtype(),
            &slot.shape,
        )
    }

    /// Copies a grad the library accepted into param `index`'s buffer (from stage_grad).
    fn copy_grad(&mut self, index: usize, grad: Grad<'_>) {
        let (src, nbytes) = grad.bytes();
        let buffer = self.params[index].grad.as_mut().expect("grad buffer");
        // SAFETY: stage_grad checked the length; the buffer holds 4 bytes per element.
        unsafe { ptr::copy_nonoverlapping(src, buffer.as_mut_ptr() as *mut u8, nbytes) };
    }

    // ---- per-param step counts ----

    /// The step counts of the params of indices `[first, first + n)`
    /// (`sa_optimizer_get_param_steps`): the steps in which each had a grad and the step
    /// was not skipped, the count its bias correction uses (torch's `state[p]["step"]`).
    pub fn param_steps(&self, first: usize, n: usize) -> Result<Vec<i64>> {
        let mut steps = vec![0i64; n];
        self.check(unsafe {
            sys::sa_optimizer_get_param_steps(
                self.raw.as_ptr(),
                first as i64,
                n as i64,
                steps.as_mut_ptr(),
            )
        })?;
        Ok(steps)
    }

    /// Replaces the step counts of the params of indices `[first, first + steps.len())`
    /// (`sa_optimizer_set_param_steps`; all checked first, nothing changes on error). Group
    /// step counts stay as they are.
    pub fn set_param_steps(&mut self, first: usize, steps: &[i64]) -> Result<()> {
        self.check(unsafe {
            sys::sa_optimizer_set_param_steps(
                self.raw.as_ptr(),
                first as i64,
                steps.len() as i64,
                steps.as_ptr(),
            )
        })
    }

    // ---- params and masters made to agree ----

    /// Casts each fp8 param of indices `[first, first + n)` again from its master by its
    /// scaling, as a step casts it after its update (`sa_optimizer_recast_params`): block
    /// scales written; a delayed scaling reads its scale now and writes its amax tensor,
    /// if any; a current scaling writes its scale from the amax of the whole tensor. Other
    /// params are left as they are. Call it after writing masters outside a step (through
    /// state views, or [`Optimizer::load`] of masters only).
    ///
    /// With a current-scaled sharded param in the range the call is collective: every rank
    /// calls it with the same range, and a failing host communicator fails it with
    /// [`Status::Comm`], the message ending with the closure's error. It synchronizes a
    /// device backend, and changes nothing on error (a bad range).
    pub fn recast_params(&mut self, first: usize, n: usize) -> Result<()> {
        comm::clear_callback_error();
        let code =
            unsafe { sys::sa_optimizer_recast_params(self.raw.as_ptr(), first as i64, n as i64) };
        self.check(code).map_err(|mut e| {
            if e.status == Status::Comm {
                if let Some(why) = comm::take_callback_error() {
                    e.message = format!("{}: {}", e.message, why);
                }
            }
            e
        })
    }

    /// Sets the master of each param of indices `[first, first + n)` from the param's
    /// value, as adding it did (`sa_optimizer_reset_masters`): an fp8 param's value times
    /// its scale's inverse (the scale tensors as they are now), a 16-bit param's value
    /// widened ([`Master::Fp32`]), a zero remainder ([`Master::Remainder`]). Moments and
    /// step counts are left as they are, and so are params without a master. Call it
    /// after writing params outside a step ([`Optimizer::param_bits8_mut`],
    /// [`Optimizer::scale_f32_mut`], device copies). It synchronizes a device backend, and
    /// changes nothing on error (a bad range).
    pub fn reset_masters(&mut self, first: usize, n: usize) -> Result<()> {
        self.check(unsafe {
            sys::sa_optimizer_reset_masters(self.raw.as_ptr(), first as i64, n as i64)
        })
    }

    // ---- step ----

    /// Runs one step over every param that has a grad, advancing its step count and each
    /// group's. Every non-empty param needs a grad bound, or to be marked as having none
    /// ([`Optimizer::clear_grad`], a `None` of [`Optimizer::set_grads`]), first
    /// (`Status::State` otherwise, naming it, and nothing is updated).
    pub fn step(&mut self) -> Result<()> {
        self.step_with(&StepArgs::default()).map(|_| ())
    }

    /// [`Optimizer::step`] with a loss scale, a found-inf flag and gradient clipping (see
    /// [`StepArgs`]); reports whether the step was skipped and the norm.
    ///
    /// A failing host communicator fails the step with [`Status::Comm`] before anything
    /// changed on this rank; the message ends with the closure's error (or its panic).
    ///
    /// On a CUDA optimizer this enqueues on the legacy default stream, as
    /// [`Optimizer::step_on`] with a NULL stream does.
    pub fn step_with(&mut self, args: &StepArgs) -> Result<StepReport> {
        // SAFETY: NULL is the legacy default stream, valid on every device.
        unsafe { self.step_on(args, ptr::null_mut()) }
    }

    /// [`Optimizer::step_with`] on the CUDA stream `stream` (a `cudaStream_t`; NULL: the
    /// legacy default stream). The CPU backend ignores the stream.
    ///
    /// When it returns (shardadam.h, `sa_optimizer_step`): on the CPU the step is done. On
    /// CUDA the step is enqueued on `stream` and the host does not wait, except where the
    /// report needs a value from the device: with `max_grad_norm`, `found_inf` or
    /// [`StepArgs::found_inf_at`] given the call reads the norm and the skip flag back, synchronizing the stream. The grads must
    /// be written before the step on the same stream (or one it waits for), and their
    /// memory must stay valid, and unwritten, until the stream has run the step. Read the
    /// params back after the stream has run it (`cudaStreamSynchronize`, or a copy on the
    /// same stream). The first step after params were added builds the launch plan and
    /// synchronizes.
    ///
    /// A CUDA step reads the loss scale and the found-inf flag from device memory: on a
    /// non-CPU optimizer the host values `inv_grad_scale` and `found_inf` are refused
    /// ([`Status::Unsupported`]); give their addresses with [`StepArgs::inv_grad_scale_at`]
    /// and [`StepArgs::found_inf_at`] instead. A host value and an address for the same
    /// input are refused on every optimizer ([`Status::InvalidArgument`]).
    ///
    /// # Safety
    ///
    /// `stream` must be NULL or a live `cudaStream_t` of the optimizer's device (the
    /// library hands it to the CUDA runtime as it is).
    pub unsafe fn step_on(&mut self, args: &StepArgs, stream: *mut c_void) -> Result<StepReport> {
        self.run_step("step_on", None, args, stream)
    }

    /// A partial step (`sa_optimizer_step_params`): [`Optimizer::step`] for `params` only
    /// (each at most once, in any order), every other param left as it is (values, state
    /// and step count), as if it had no grad. For an engine that steps each layer as soon
    /// as its grads are ready, or offloaded state a part at a time.
    ///
    /// Per-param step counts ([`Optimizer::param_steps`]) advance as in a step, so bias
    /// correction is exact however the params are split; group step counts
    /// ([`Optimizer::step_count`]) do not (they count full steps). A listed param marked as
    /// having no grad is skipped; one never given a grad is refused ([`Status::State`]), as
    /// in a step; the others need no grad. A param listed twice, or one of another
    /// optimizer, is [`Status::InvalidArgument`]. Everything is checked before anything
    /// changes.
    pub fn step_params(&mut self, params: &[Param]) -> Result<()> {
        self.step_params_with(params, &StepArgs::default())
            .map(|_| ())
    }

    /// [`Optimizer::step_params`] with a loss scale and a found-inf flag, as
    /// [`Optimizer::step_with`] takes them (they apply to the listed params); reports
    /// whether the step was skipped. No clipping: the norm is that of every grad, so
    /// [`StepArgs::max_grad_norm`] must be `None` ([`Status::InvalidArgument`]); clip in a
    /// full step.
    ///
    /// On a CUDA optimizer this enqueues on the legacy default stream, as
    /// [`Optimizer::step_params_on`] with a NULL stream does.
    pub fn step_params_with(&mut self, params: &[Param], args: &StepArgs) -> Result<StepReport> {
        // SAFETY: NULL is the legacy default stream, valid on every device.
        unsafe { self.step_params_on(params, args, ptr::null_mut()) }
    }

    /// [`Optimizer::step_params_with`] on the CUDA stream `stream` (a `cudaStream_t`; NULL:
    /// the legacy default stream). The CPU backend ignores the stream. When it returns, and
    /// what `args` may hold on a CUDA optimizer: as [`Optimizer::step_on`]. With state on
    /// the host, only the parts that hold a listed param move over the link.
    ///
    /// # Safety
    ///
    /// As [`Optimizer::step_on`]: `stream` must be NULL or a live `cudaStream_t` of the
    /// optimizer's device.
    pub unsafe fn step_params_on(
        &mut self,
        params: &[Param],
        args: &StepArgs,
        stream: *mut c_void,
    ) -> Result<StepReport> {
        let indices = params
            .iter()
            .map(|&p| self.slot(p).map(|_| p.index))
            .collect::<Result<Vec<i64>>>()?;
        self.run_step("step_params_on", Some(&indices), args, stream)
    }

    /// `sa_optimizer_step` (`params` `None`) or `sa_optimizer_step_params` (the indices
    /// given) with `args`; `op` names the caller in the messages of this crate's checks.
    unsafe fn run_step(
        &mut self,
        op: &str,
        params: Option<&[i64]>,
        args: &StepArgs,
        stream: *mut c_void,
    ) -> Result<StepReport> {
        let device = self.device.unwrap_or(Device::Cpu);
        let memory = args.memory;
        if args.inv_grad_scale.is_some() && !memory.inv_grad_scale.is_null() {
            return Err(invalid(format!(
                "{}: inv_grad_scale and inv_grad_scale_at are both given; give one",
                op
            )));
        }
        if args.found_inf.is_some() && !memory.found_inf.is_null() {
            return Err(invalid(format!(
                "{}: found_inf and found_inf_at are both given; give one",
                op
            )));
        }
        if device != Device::Cpu && (args.inv_grad_scale.is_some() || args.found_inf.is_some()) {
            return Err(Error {
                status: Status::Unsupported,
                message: format!(
                    "{}: the params are on {:?}, where inv_grad_scale and found_inf are read \
                     from device memory; give their addresses with \
                     StepArgs::inv_grad_scale_at and found_inf_at (host values are for CPU \
                     optimizers)",
                    op, device
                ),
            });
        }
        let scale = args.inv_grad_scale.unwrap_or(1.0);
        let found_inf = if args.found_inf == Some(true) {
            1.0f32
        } else {
            0.0
        };
        let mut skipped = 0i32;
        let mut norm = f64::NAN;
        // The addresses of `memory` are the caller's promise (the unsafe setters).
        let mut raw = sys::sa_step_args {
            inv_grad_scale: memory.inv_grad_scale,
            found_inf: memory.found_inf,
            grad_norm: memory.grad_norm,
            norm_type: args.norm_type.raw(),
            ..sys::sa_step_args::default()
        };
        if args.inv_grad_scale.is_some() {
            raw.inv_grad_scale = &scale;
        }
        if args.found_inf.is_some() {
            raw.found_inf = &found_inf;
        }
        // Only these can skip a step; asking for the flag otherwise would make a CUDA step
        // wait for the device for nothing.
        if !raw.found_inf.is_null() || args.max_grad_norm.is_some() {
            raw.skipped = &mut skipped;
        }
        if let Some(bound) = args.max_grad_norm {
            // The library checks the bound (> 0, not NaN; none in a partial step) and says
            // what was wrong.
            raw.max_grad_norm = bound;
            raw.host_grad_norm = &mut norm;
        }
        comm::clear_callback_error();
        // `scale` and `found_inf` are host memory read during the call: only CPU steps get
        // them (above).
        let code = match params {
            None => sys::sa_optimizer_step(self.raw.as_ptr(), &raw, stream),
            Some(indices) => sys::sa_optimizer_step_params(
                self.raw.as_ptr(),
                indices.len() as i64,
                indices.as_ptr(),
                &raw,
                stream,
            ),
        };
        if let Err(mut e) = self.check(code) {
            if e.status == Status::Comm {
                if let Some(why) = comm::take_callback_error() {
                    e.message = format!("{}: {}", e.message, why);
                }
            }
            return Err(e);
        }
        Ok(StepReport {
            skipped: skipped != 0,
            grad_norm: args.max_grad_norm.map(|_| norm),
        })
    }

    /// Enqueues on `stream` the upload of what changed on the host since the last step:
    /// grad bindings and hyperparameters (`sa_optimizer_flush`). A step does this itself;
    /// call it only before replaying a step captured in a CUDA graph. It returns once the
    /// upload is enqueued (the host does not wait); the CPU backend has nothing to upload.
    ///
    /// # Safety
    ///
    /// As [`Optimizer::step_on`]: `stream` is NULL or a live `cudaStream_t` of the
    /// optimizer's device.
    pub unsafe fn flush(&mut self, stream: *mut c_void) -> Result<()> {
        self.check(sys::sa_optimizer_flush(self.raw.as_ptr(), stream))
    }

    // ---- communicator ----

    /// Gives the optimizer a communicator for its steps (`sa_optimizer_set_comm`),
    /// replacing any earlier one. The optimizer keeps it alive: `comm` may be dropped
    /// afterwards. From now on a step with a norm or a found-inf flag is collective (see
    /// [`StepArgs`]). A CPU optimizer needs a host communicator ([`Comm::host`]); an NCCL one
    /// must be on the optimizer's CUDA device (checked at the step: [`Status::Mismatch`]).
    pub fn set_comm(&mut self, comm: &Comm) -> Result<()> {
        self.check(unsafe { sys::sa_optimizer_set_comm(self.raw.as_ptr(), comm.as_ptr()) })
    }

    /// Takes the communicator away: steps are rank-local again, and the optimizer's
    /// reference to the communicator is released.
    pub fn clear_comm(&mut self) -> Result<()> {
        self.check(unsafe { sys::sa_optimizer_set_comm(self.raw.as_ptr(), ptr::null_mut()) })
    }

    // ---- state ----

    /// Calls `f` with a state view's dtype and bytes, then releases the view.
    fn with_state<T>(
        &mut self,
        param: Param,
        key: &str,
        f: impl FnOnce(DType, &[u8]) -> Result<T>,
    ) -> Result<T> {
        self.slot(param)?;
        let c_key = CString::new(key)
            .map_err(|_| invalid(format!("state: key {:?} contains a NUL byte", key)))?;
        let mut view: *mut sys::DLManagedTensorVersioned = ptr::null_mut();
        self.check(unsafe {
            sys::sa_optimizer_state_view(self.raw.as_ptr(), param.index, c_key.as_ptr(), &mut view)
        })?;
        // SAFETY: on SA_OK the view is valid until its deleter runs, below.
        let result = unsafe {
            let t = &(*view).dl_tensor;
            if Device::from_raw(t.device) != Device::Cpu {
                let device = Device::from_raw(t.device);
                if let Some(deleter) = (*view).deleter {
                    deleter(view);
                }
                return Err(Error {
                    status: Status::Unsupported,
                    message: format!(
                        "state: '{}' of param '{}' is in {:?} memory, which this crate does \
                         not read; copy it out with the device's API (sa_optimizer_state_view)",
                        key, self.params[param.index as usize].name, device
                    ),
                });
            }
            let numel: i64 = (0..t.ndim as usize).map(|i| *t.shape.add(i)).product();
            let nbytes = numel as usize * (t.dtype.bits as usize / 8);
            let bytes: &[u8] = if nbytes == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(
                    (t.data as *const u8).add(t.byte_offset as usize),
                    nbytes,
                )
            };
            match DType::from_dlpack(t.dtype) {
                Some(dtype) => f(dtype, bytes),
                None => Err(Error {
                    status: Status::Unsupported,
                    message: format!("state '{}': unknown dtype", key),
                }),
            }
        };
        unsafe {
            if let Some(deleter) = (*view).deleter {
                deleter(view);
            }
        }
        result
    }

    /// A copy of one state of a param as f32: "exp_avg", "exp_avg_sq", "max_exp_avg_sq"
    /// (amsgrad) or "master" (fp32 master). bfloat16 moments are widened exactly; for the
    /// int16 "remainder" use [`Optimizer::state_i16`], for moments stored as 8-bit or
    /// float8 block codes [`Optimizer::moment_values`].
    pub fn state(&mut self, param: Param, key: &str) -> Result<Vec<f32>> {
        let name = self.slot(param)?.name.clone();
        self.with_state(param, key, |dtype, bytes| match dtype {
            DType::Float32 => Ok(bytes
                .chunks_exact(4)
                .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                .collect()),
            DType::BFloat16 => Ok(bytes
                .chunks_exact(2)
                .map(|b| bf16_to_f32(u16::from_ne_bytes([b[0], b[1]])))
                .collect()),
            other => Err(Error {
                status: Status::Unsupported,
                message: format!(
                    "state: '{}' of param '{}' {}",
                    key,
                    name,
                    match other {
                        DType::Int16 => "is int16; use state_i16".to_string(),
                        DType::Uint8 => "holds uint8 codes (8-bit moments); moment_values \
                                         gives their float32 values"
                            .to_string(),
                        DType::Float8E4m3fn => "holds float8_e4m3fn codes (moments with a \
                                                scale per block); moment_values gives their \
                                                float32 values"
                            .to_string(),
                        _ => format!(
                            "is {}, which state does not read (it reads float32 and bfloat16)",
                            other.name()
                        ),
                    }
                ),
            }),
        })
    }

    /// A moment of a param ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") as float32 values
    /// in row-major order of its local shape (`sa_optimizer_get_moment_values`), whatever
    /// its storage: float32 as is, bfloat16 widened, 8-bit and float8 block codes decoded
    /// as shard files hold them (docs/precision.md: 8-bit moments). Works on any device: a device
    /// backend is synchronized and the values copied to the host. Other keys fail with the
    /// library's message.
    pub fn moment_values(&mut self, param: Param, key: &str) -> Result<Vec<f32>> {
        let slot = self.slot(param)?;
        let c_key = CString::new(key)
            .map_err(|_| invalid(format!("moment_values: key {:?} contains a NUL byte", key)))?;
        let mut values = vec![0f32; slot.numel];
        let out = host_dl_tensor(
            values.as_mut_ptr() as *mut c_void,
            DType::Float32,
            &slot.shape,
        )?;
        self.check(unsafe {
            sys::sa_optimizer_get_moment_values(
                self.raw.as_ptr(),
                param.index,
                c_key.as_ptr(),
                &out,
            )
        })?;
        Ok(values)
    }

    /// A copy of the int16 "remainder" state of a param.
    pub fn state_i16(&mut self, param: Param, key: &str) -> Result<Vec<i16>> {
        self.with_state(param, key, |dtype, bytes| match dtype {
            DType::Int16 => Ok(bytes
                .chunks_exact(2)
                .map(|b| i16::from_ne_bytes([b[0], b[1]]))
                .collect()),
            other => Err(Error {
                status: Status::Mismatch,
                message: format!("state_i16: '{}' is {:?}, not int16; use state", key, other),
            }),
        })
    }

    // ---- shard files ----

    /// Writes this rank's state as one shard file at `path` (`sa_optimizer_export`): every
    /// param's states, the groups with their step counts, and where each shard sits in its
    /// global tensor, as a valid safetensors file. It goes to a temporary name, is synced and
    /// renamed, so a crash never leaves a file that looks complete. A param replicated along
    /// a mesh dim is written only by the replica at coordinate 0.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let c_path = path_cstring(path.as_ref())?;
        let mut writer = sys::sa_writer::default();
        handleless_result(unsafe { sys::sa_file_writer(c_path.as_ptr(), &mut writer) })?;
        let exported = self.check(unsafe { sys::sa_optimizer_export(self.raw.as_ptr(), &writer) });
        // After the message was read; removes the temporary file of a failed export.
        unsafe { sys::sa_writer_release(&mut writer) };
        exported
    }

    /// Starts writing this rank's state as one shard file at `path`, as [`Optimizer::save`]
    /// does, without waiting for the write (`sa_optimizer_export_async`): the state is
    /// copied into a snapshot (the optimizer keeps its memory for the next saves: as many
    /// bytes as the state), then a thread of the library's writes the snapshot, and the
    /// returned [`ExportJob`] says when it has ended. The file holds exactly what `save`
    /// would have written at the moment of this call.
    ///
    /// Steps (and loads, and hyperparameter changes) may follow as soon as this returns:
    /// they change the state, not the snapshot. The file appears at `path` only when the
    /// job ends (it is written under a temporary name, then synced and renamed into place);
    /// [`ExportJob::wait`] says when, and returns the write's error. Dropping the job waits
    /// for it. One save writes at a time per optimizer: a `save` or `save_async` called
    /// while a job writes first waits for that job to end.
    ///
    /// Errors found before anything starts come back here: an I/O error when the temporary
    /// file cannot be created (a directory that does not exist), an optimizer left unusable
    /// by a failed load, no memory for the snapshot. Nothing is written then.
    ///
    /// ```
    /// use shardadam::{GroupConfig, Optimizer};
    ///
    /// let mut opt = Optimizer::new(None)?;
    /// opt.add_group(&GroupConfig::new())?;
    /// let w = opt.add_param("w", 0, &[2], vec![1.0, 2.0], None)?;
    /// let name = format!("shardadam-save-async-{}.safetensors", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// let mut job = opt.save_async(&path)?; // the state as it is now
    /// opt.set_grad(w, &[0.5, -0.5])?;
    /// opt.step()?; // while the file is written
    /// job.wait()?; // the file is in place: the state before the step
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shardadam::Error>(())
    /// ```
    pub fn save_async(&self, path: impl AsRef<Path>) -> Result<ExportJob> {
        let path = path.as_ref();
        let c_path = path_cstring(path)?;
        let mut writer = Box::new(sys::sa_writer::default());
        handleless_result(unsafe { sys::sa_file_writer(c_path.as_ptr(), &mut *writer) })?;
        let mut raw = ptr::null_mut();
        let started = self.check(unsafe {
            sys::sa_optimizer_export_async(self.raw.as_ptr(), &*writer, &mut raw)
        });
        match (started, NonNull::new(raw)) {
            (Ok(()), Some(raw)) => Ok(ExportJob {
                raw,
                writer,
                path: path.to_path_buf(),
            }),
            (started, _) => {
                // Nothing started: after the message was read, the writer goes, and with it
                // the temporary file.
                unsafe { sys::sa_writer_release(&mut *writer) };
                started?;
                Err(Error {
                    status: Status::Internal,
                    message: "sa_optimizer_export_async returned SA_OK and no job".to_string(),
                })
            }
        }
    }

    /// Loads the state saved in the shard files at `paths`, written by any number of ranks
    /// with any layout, into this optimizer's state, resharding as needed
    /// (`sa_optimizer_import`). Everything is validated before anything changes; params
    /// themselves are not touched.
    pub fn load<P: AsRef<Path>>(&mut self, paths: &[P], options: &LoadOptions) -> Result<()> {
        let mut readers = Readers(Vec::with_capacity(paths.len()));
        for path in paths {
            let c_path = path_cstring(path.as_ref())?;
            let mut reader = sys::sa_reader::default();
            handleless_result(unsafe { sys::sa_file_reader(c_path.as_ptr(), &mut reader) })?;
            readers.0.push(reader);
        }
        let pointers: Vec<*const sys::sa_reader> = readers
            .0
            .iter()
            .map(|r| r as *const sys::sa_reader)
            .collect();
        let raw = sys::sa_import_options {
            staging_bytes: options.staging_bytes,
            allow_missing: options.allow_missing as i32,
            allow_unexpected: options.allow_unexpected as i32,
            restore_groups: options.restore_groups as i32,
            read_once: options.read_once as i32,
            ..sys::sa_import_options::default()
        };
        self.check(unsafe {
            sys::sa_optimizer_import(
                self.raw.as_ptr(),
                pointers.len() as i32,
                pointers.as_ptr(),
                &raw,
            )
        })
    }
}

/// The wrapper's check of a `Vec` moved in as a param: one value per element of `shape`.
fn check_values(name: &str, shape: &[i64], len: usize) -> Result<()> {
    if shape.iter().any(|&d| d < 0) {
        return Err(invalid(format!(
            "add_param: param '{}': shape {:?} has a negative dim",
            name, shape
        )));
    }
    let numel = shape.iter().product::<i64>() as usize;
    if len != numel {
        return Err(invalid(format!(
            "add_param: param '{}': data has {} values, shape {:?} needs {}",
            name, len, shape, numel
        )));
    }
    Ok(())
}

fn wrong_dtype(slot: &ParamSlot, op: &str) -> Error {
    Error {
        status: Status::Mismatch,
        message: match slot.dtype {
            Some(dtype) => format!("{}: param '{}' is {:?}", op, slot.name, dtype),
            None => format!(
                "{}: param '{}' has a dtype this crate does not name",
                op, slot.name
            ),
        },
    }
}
