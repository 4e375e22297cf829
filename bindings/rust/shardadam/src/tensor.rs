//! [`Tensor`]: the memory of a param or a grad, in any device's memory, as the library
//! takes it (a DLPack tensor), and what keeps that memory alive.

use crate::{invalid, DType, Result};
use shardadam_sys as sys;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

/// Where a tensor's memory is (DLPack's `DLDevice`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Device {
    /// Host memory (`kDLCPU`, device id 0).
    Cpu,
    /// The memory of CUDA device `n` (`kDLCUDA`), as `cudaMalloc` returns it.
    Cuda(i32),
    /// Any other DLPack device; the library says which ones it serves.
    Other(sys::DLDevice),
}

impl Device {
    /// The DLPack device.
    pub fn raw(self) -> sys::DLDevice {
        match self {
            Device::Cpu => sys::DLDevice {
                device_type: sys::kDLCPU,
                device_id: 0,
            },
            Device::Cuda(id) => sys::DLDevice {
                device_type: sys::kDLCUDA,
                device_id: id,
            },
            Device::Other(raw) => raw,
        }
    }

    /// The device of a DLPack device.
    pub fn from_raw(raw: sys::DLDevice) -> Device {
        match (raw.device_type, raw.device_id) {
            (sys::kDLCPU, 0) => Device::Cpu,
            (sys::kDLCUDA, id) => Device::Cuda(id),
            _ => Device::Other(raw),
        }
    }
}

/// What keeps a tensor's memory valid.
pub(crate) enum Keeper {
    /// The caller's promise, given to the unsafe constructor.
    Promise,
    /// Host values owned by the tensor.
    F32(Vec<f32>),
    /// Host 16-bit values (bfloat16, float16 bits) owned by the tensor.
    Bits16(Vec<u16>),
    /// Host 8-bit codes (fp8 params and scales, uint8) owned by the tensor.
    Bits8(Vec<u8>),
    /// A DLPack producer's tensor, its deleter called when the tensor is dropped.
    Managed(NonNull<sys::DLManagedTensorVersioned>),
    /// The same for a producer of the pre-1.0 `DLManagedTensor`.
    Legacy(NonNull<sys::DLManagedTensor>),
}

/// The memory of a param or a grad as the library takes it: a DLPack tensor (data
/// pointer, device, dtype, shape, optional strides) plus whatever keeps the memory valid.
///
/// A tensor made from a `Vec` ([`Tensor::from_f32`], [`Tensor::from_bits16`],
/// [`Tensor::from_bits8`]) owns its values and is safe throughout. The other constructors are `unsafe`: Rust cannot see
/// device memory or a DLPack producer's memory, so the caller promises what the library
/// relies on (see each constructor's "Safety"). The library checks everything a tensor
/// says about itself (dtype, shape, device, strides, alignment) on every call that takes
/// one, and says in its message what was wrong; the promise covers only what it cannot
/// see: that the memory exists, is as large as the tensor says, and stays valid as long
/// as it is used.
///
/// A tensor moved into an optimizer ([`crate::Optimizer::add_tensor`],
/// [`crate::Optimizer::add_fp8_tensor`] with its scale tensors,
/// [`crate::Optimizer::bind_grad`]) is kept there as long as the optimizer uses it, and
/// dropped (a producer's deleter called) when the optimizer is dropped or, for a grad,
/// when the binding is replaced.
pub struct Tensor {
    // shape and strides point into the Vecs below, whose heap buffers do not move when
    // the Tensor does.
    pub(crate) raw: sys::DLTensor,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    pub(crate) keeper: Keeper,
}

impl Drop for Tensor {
    fn drop(&mut self) {
        // SAFETY: the producer handed the tensor over with its deleter; it is called once,
        // here, unless the library took the tensor (then the keeper is Promise).
        unsafe {
            match self.keeper {
                Keeper::Managed(m) => {
                    if let Some(deleter) = (*m.as_ptr()).deleter {
                        deleter(m.as_ptr());
                    }
                }
                Keeper::Legacy(m) => {
                    if let Some(deleter) = (*m.as_ptr()).deleter {
                        deleter(m.as_ptr());
                    }
                }
                _ => {}
            }
        }
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("data", &self.raw.data)
            .field("byte_offset", &self.raw.byte_offset)
            .field("device", &self.device())
            .field("dtype", &self.raw.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .finish()
    }
}

/// That `len` values fill `shape` (what a host tensor built from a Vec needs).
fn check_len(what: &str, len: usize, shape: &[i64]) -> Result<()> {
    let numel = numel_of(shape, what)?;
    if len != numel {
        return Err(invalid(format!(
            "{}: {} values, shape {:?} needs {}",
            what, len, shape, numel
        )));
    }
    Ok(())
}

fn numel_of(shape: &[i64], what: &str) -> Result<usize> {
    if shape.iter().any(|&d| d < 0) {
        return Err(invalid(format!(
            "{}: shape {:?} has a negative dim",
            what, shape
        )));
    }
    Ok(shape.iter().product::<i64>() as usize)
}

impl Tensor {
    fn new(
        data: *mut c_void,
        device: sys::DLDevice,
        dtype: sys::DLDataType,
        shape: Vec<i64>,
        strides: Option<Vec<i64>>,
        byte_offset: u64,
        keeper: Keeper,
    ) -> Tensor {
        let mut t = Tensor {
            raw: sys::DLTensor {
                data,
                device,
                ndim: shape.len() as i32,
                dtype,
                shape: ptr::null_mut(),
                strides: ptr::null_mut(),
                byte_offset,
            },
            shape,
            strides,
            keeper,
        };
        // The library reads shape and strides and never writes them.
        t.raw.shape = t.shape.as_mut_ptr();
        if let Some(s) = t.strides.as_mut() {
            t.raw.strides = s.as_mut_ptr();
        }
        t
    }

    /// A tensor with the data, device, dtype, shape, strides and offset of `t`, its memory
    /// kept alive by `keeper` (the one path of from_dl_tensor and the managed forms).
    ///
    /// # Safety
    ///
    /// As [`Tensor::from_dl_tensor`].
    unsafe fn describing(t: &sys::DLTensor, keeper: Keeper) -> Result<Tensor> {
        let (shape, strides) = copy_dims(t)?;
        Ok(Tensor::new(
            t.data,
            t.device,
            t.dtype,
            shape,
            strides,
            t.byte_offset,
            keeper,
        ))
    }

    /// A contiguous host tensor at `data`, which `keeper` (the `Vec` it points into) owns.
    fn host(data: *mut c_void, dtype: sys::DLDataType, shape: &[i64], keeper: Keeper) -> Tensor {
        Tensor::new(
            data,
            Device::Cpu.raw(),
            dtype,
            shape.to_vec(),
            None,
            0,
            keeper,
        )
    }

    /// A host float32 tensor owning `values` (row-major, `shape`'s element count).
    pub fn from_f32(mut values: Vec<f32>, shape: &[i64]) -> Result<Tensor> {
        check_len("Tensor::from_f32", values.len(), shape)?;
        let data = values.as_mut_ptr() as *mut c_void;
        Ok(Tensor::host(
            data,
            DType::Float32.dlpack()?,
            shape,
            Keeper::F32(values),
        ))
    }

    /// A host bfloat16 or float16 tensor owning `bits` (raw bits, row-major).
    pub fn from_bits16(dtype: DType, mut bits: Vec<u16>, shape: &[i64]) -> Result<Tensor> {
        if dtype != DType::BFloat16 && dtype != DType::Float16 {
            return Err(invalid(format!(
                "Tensor::from_bits16: dtype {:?} is not a 16-bit float",
                dtype
            )));
        }
        check_len("Tensor::from_bits16", bits.len(), shape)?;
        let data = bits.as_mut_ptr() as *mut c_void;
        Ok(Tensor::host(
            data,
            dtype.dlpack()?,
            shape,
            Keeper::Bits16(bits),
        ))
    }

    /// A host tensor of an 8-bit dtype owning `codes` (raw codes, row-major): the codes of
    /// an fp8 param ([`DType::Float8E4m3fn`], [`DType::Float8E5m2`]) or of MXFP8 block
    /// scales ([`DType::Float8E8m0fnu`]), for [`crate::Optimizer::add_fp8_tensor`]. The
    /// dtype's width is the library's ([`crate::dtypes`]): one that is not 8 bits wide is
    /// refused.
    pub fn from_bits8(dtype: DType, mut codes: Vec<u8>, shape: &[i64]) -> Result<Tensor> {
        let dlpack = dtype.dlpack()?;
        if dlpack.bits != 8 || dlpack.lanes != 1 {
            return Err(invalid(format!(
                "Tensor::from_bits8: dtype {:?} is not 8 bits wide",
                dtype
            )));
        }
        check_len("Tensor::from_bits8", codes.len(), shape)?;
        let data = codes.as_mut_ptr() as *mut c_void;
        Ok(Tensor::host(data, dlpack, shape, Keeper::Bits8(codes)))
    }

    /// A C-contiguous tensor of `dtype` and `shape` at `data` on `device`: device memory
    /// from `cudaMalloc` (or a caching allocator), or host memory the caller manages.
    ///
    /// # Safety
    ///
    /// `data` must point to at least `shape`'s element count times the dtype's size of
    /// memory on `device`, readable and writable, and stay valid for as long as an
    /// optimizer uses the tensor: for a param until the optimizer is dropped; for a grad
    /// until its binding is replaced or cleared or the optimizer is dropped; and on CUDA,
    /// beyond that, until the stream has run every step enqueued with it (dropping the
    /// tensor does not wait for the device). Nothing else may write a param's memory
    /// while a step runs (on CUDA: concurrently with the stream's step), nor a grad's. The
    /// optimizer may use the memory from whichever thread it is moved to (it is `Send`).
    pub unsafe fn from_raw_parts(
        data: *mut c_void,
        device: Device,
        dtype: DType,
        shape: &[i64],
    ) -> Result<Tensor> {
        numel_of(shape, "Tensor::from_raw_parts")?;
        Ok(Tensor::new(
            data,
            device.raw(),
            dtype.dlpack()?,
            shape.to_vec(),
            None,
            0,
            Keeper::Promise,
        ))
    }

    /// [`Tensor::from_raw_parts`] on CUDA device `device_id`: `data` is a device pointer
    /// (from `cudaMalloc`, `cudaMallocAsync`, or an engine's allocator).
    ///
    /// # Safety
    ///
    /// As [`Tensor::from_raw_parts`].
    pub unsafe fn cuda(
        data: *mut c_void,
        device_id: i32,
        dtype: DType,
        shape: &[i64],
    ) -> Result<Tensor> {
        Tensor::from_raw_parts(data, Device::Cuda(device_id), dtype, shape)
    }

    /// A tensor borrowing what a DLPack `DLTensor` describes (any device, dtype, strides:
    /// the library decides what it accepts). The shape and strides are copied now; the
    /// memory is not.
    ///
    /// # Safety
    ///
    /// `tensor.shape` (and `tensor.strides` unless NULL) must point to `tensor.ndim`
    /// values, and the memory the tensor describes must be valid as
    /// [`Tensor::from_raw_parts`] requires, for as long as it says.
    pub unsafe fn from_dl_tensor(tensor: &sys::DLTensor) -> Result<Tensor> {
        Tensor::describing(tensor, Keeper::Promise)
    }

    /// Takes a DLPack producer's tensor (`DLManagedTensorVersioned`, DLPack >= 1.0): its
    /// deleter is called when the tensor is dropped (the library calls it itself for a
    /// param it took). The library refuses read-only tensors as params.
    ///
    /// # Safety
    ///
    /// `managed` must be a valid managed tensor that nobody else will delete, its
    /// `dl_tensor` as [`Tensor::from_dl_tensor`] requires, its memory valid until its
    /// deleter runs (on CUDA: and until the stream has run every step enqueued with it),
    /// and its deleter callable from any thread (an optimizer may be dropped on another).
    pub unsafe fn from_managed(managed: *mut sys::DLManagedTensorVersioned) -> Result<Tensor> {
        let m = NonNull::new(managed)
            .ok_or_else(|| invalid("Tensor::from_managed: the managed tensor is NULL".into()))?;
        Tensor::describing(&(*managed).dl_tensor, Keeper::Managed(m))
    }

    /// [`Tensor::from_managed`] for producers of the pre-1.0 `DLManagedTensor`.
    ///
    /// # Safety
    ///
    /// As [`Tensor::from_managed`].
    pub unsafe fn from_managed_legacy(managed: *mut sys::DLManagedTensor) -> Result<Tensor> {
        let m = NonNull::new(managed).ok_or_else(|| {
            invalid("Tensor::from_managed_legacy: the managed tensor is NULL".into())
        })?;
        Tensor::describing(&(*managed).dl_tensor, Keeper::Legacy(m))
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product::<i64>().max(0) as usize
    }

    /// Where the memory is.
    pub fn device(&self) -> Device {
        Device::from_raw(self.raw.device)
    }

    /// The dtype, if it is one [`DType`] names.
    pub fn dtype(&self) -> Option<DType> {
        DType::from_dlpack(self.raw.dtype)
    }

    /// The address of the first element (`data + byte_offset`), in the device's memory:
    /// where to copy a grad to, or read a param from, with the device's own API.
    pub fn data_ptr(&self) -> *mut c_void {
        (self.raw.data as *mut u8).wrapping_add(self.raw.byte_offset as usize) as *mut c_void
    }

    /// The DLPack tensor the library is handed.
    pub fn as_dl_tensor(&self) -> &sys::DLTensor {
        &self.raw
    }

    /// The values of a tensor made by [`Tensor::from_f32`].
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.keeper {
            Keeper::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The values of a tensor made by [`Tensor::from_f32`], writable.
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.keeper {
            Keeper::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The bits of a tensor made by [`Tensor::from_bits16`].
    pub fn as_bits16(&self) -> Option<&[u16]> {
        match &self.keeper {
            Keeper::Bits16(v) => Some(v),
            _ => None,
        }
    }

    /// The bits of a tensor made by [`Tensor::from_bits16`], writable.
    pub fn as_bits16_mut(&mut self) -> Option<&mut [u16]> {
        match &mut self.keeper {
            Keeper::Bits16(v) => Some(v),
            _ => None,
        }
    }

    /// The codes of a tensor made by [`Tensor::from_bits8`].
    pub fn as_bits8(&self) -> Option<&[u8]> {
        match &self.keeper {
            Keeper::Bits8(v) => Some(v),
            _ => None,
        }
    }

    /// The codes of a tensor made by [`Tensor::from_bits8`], writable.
    pub fn as_bits8_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.keeper {
            Keeper::Bits8(v) => Some(v),
            _ => None,
        }
    }

    /// Whether the tensor owns its values (a `Vec`): then this crate can read them.
    pub(crate) fn owns_values(&self) -> bool {
        matches!(
            self.keeper,
            Keeper::F32(_) | Keeper::Bits16(_) | Keeper::Bits8(_)
        )
    }

    /// Gives up the deleter of a managed tensor, whose ownership the library took.
    pub(crate) fn release_to_library(&mut self) {
        self.keeper = Keeper::Promise;
    }
}

/// The shape and strides of a DLPack tensor, copied.
unsafe fn copy_dims(t: &sys::DLTensor) -> Result<(Vec<i64>, Option<Vec<i64>>)> {
    if t.ndim < 0 || t.ndim as usize > sys::SA_MAX_NDIM {
        return Err(invalid(format!(
            "DLTensor: ndim {} is outside [0, {}]",
            t.ndim,
            sys::SA_MAX_NDIM
        )));
    }
    let n = t.ndim as usize;
    if n > 0 && t.shape.is_null() {
        return Err(invalid(format!("DLTensor: ndim {} with a NULL shape", n)));
    }
    let shape = if n == 0 {
        Vec::new()
    } else {
        std::slice::from_raw_parts(t.shape, n).to_vec()
    };
    let strides = if t.strides.is_null() || n == 0 {
        None
    } else {
        Some(std::slice::from_raw_parts(t.strides, n).to_vec())
    };
    Ok((shape, strides))
}
