//! The few CUDA runtime calls the GPU example and the GPU test need, loaded at run time
//! with `dlopen` (declared by hand below: no crate, no link to CUDA), so that building
//! them needs no CUDA and a machine without it runs them to a "skipped" message.
//!
//! Shared by `examples/gpu_step.rs` and `tests/gpu.rs` (which includes this file by path).
//! Not part of the `shardadam` crate: the crate takes device memory as pointers and knows
//! nothing of how it was allocated.
#![allow(dead_code)] // each user takes its subset

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};

extern "C" {
    // glibc >= 2.34 has these in libc itself, which every Rust program links.
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}
const RTLD_NOW: c_int = 2;

type Code = c_int; // cudaError_t; 0 is cudaSuccess
const MEMCPY_HOST_TO_DEVICE: c_int = 1;
const MEMCPY_DEVICE_TO_HOST: c_int = 2;

/// The CUDA runtime (libcudart), loaded.
pub struct Cudart {
    library: String,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> Code,
    set_device: unsafe extern "C" fn(c_int) -> Code,
    runtime_get_version: unsafe extern "C" fn(*mut c_int) -> Code,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Code,
    free: unsafe extern "C" fn(*mut c_void) -> Code,
    memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, *mut c_void) -> Code,
    stream_create: unsafe extern "C" fn(*mut *mut c_void) -> Code,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> Code,
    stream_destroy: unsafe extern "C" fn(*mut c_void) -> Code,
    get_error_string: unsafe extern "C" fn(Code) -> *const c_char,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
    unsafe {
        let e = dlerror();
        if e.is_null() {
            "no reason given".to_string()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// The function `symbol` of the library `handle`, as the function pointer type F.
///
/// # Safety
///
/// F must be the symbol's C signature.
unsafe fn symbol<F: Copy>(handle: *mut c_void, library: &str, symbol: &str) -> Result<F, String> {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    let c = CString::new(symbol).map_err(|_| format!("{:?}: NUL", symbol))?;
    let p = dlsym(handle, c.as_ptr());
    if p.is_null() {
        return Err(format!("{} has no {}: {}", library, symbol, dl_error()));
    }
    Ok(std::mem::transmute_copy::<*mut c_void, F>(&p))
}

impl Cudart {
    /// Loads libcudart: `$SHARDADAM_CUDART` when set, else the first of libcudart.so,
    /// .so.13 and .so.12 the dynamic loader finds (LD_LIBRARY_PATH, ldconfig's cache). Err
    /// says why none loaded.
    pub fn load() -> Result<Cudart, String> {
        let names: Vec<String> = match std::env::var("SHARDADAM_CUDART") {
            Ok(path) if !path.is_empty() => vec![path],
            _ => ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        let mut reasons = Vec::new();
        for name in &names {
            let c_name = CString::new(name.as_str()).map_err(|_| format!("{:?}: NUL", name))?;
            // SAFETY: dlopen of a library; its initializers are the CUDA runtime's.
            let handle = unsafe { dlopen(c_name.as_ptr(), RTLD_NOW) };
            if handle.is_null() {
                reasons.push(dl_error());
                continue;
            }
            // SAFETY: each symbol has the C signature of the CUDA runtime API (cuda_runtime_api.h).
            return unsafe { Cudart::resolve(handle, name) };
        }
        Err(format!(
            "no CUDA runtime could be loaded ({}); set LD_LIBRARY_PATH to the directory of \
             libcudart.so or SHARDADAM_CUDART to its path",
            reasons.join("; ")
        ))
    }

    unsafe fn resolve(handle: *mut c_void, name: &str) -> Result<Cudart, String> {
        Ok(Cudart {
            library: name.to_string(),
            get_device_count: symbol(handle, name, "cudaGetDeviceCount")?,
            set_device: symbol(handle, name, "cudaSetDevice")?,
            runtime_get_version: symbol(handle, name, "cudaRuntimeGetVersion")?,
            malloc: symbol(handle, name, "cudaMalloc")?,
            free: symbol(handle, name, "cudaFree")?,
            memcpy_async: symbol(handle, name, "cudaMemcpyAsync")?,
            stream_create: symbol(handle, name, "cudaStreamCreate")?,
            stream_synchronize: symbol(handle, name, "cudaStreamSynchronize")?,
            stream_destroy: symbol(handle, name, "cudaStreamDestroy")?,
            get_error_string: symbol(handle, name, "cudaGetErrorString")?,
        })
    }

    /// Which library was loaded and the runtime version it reports.
    pub fn describe(&self) -> String {
        let mut version = 0;
        unsafe { (self.runtime_get_version)(&mut version) };
        format!(
            "{} (CUDA runtime {}.{})",
            self.library,
            version / 1000,
            version % 1000 / 10
        )
    }

    fn check(&self, code: Code, what: &str) -> Result<(), String> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString returns a static string for every code.
        let why = unsafe { CStr::from_ptr((self.get_error_string)(code)) };
        Err(format!(
            "{} failed: {} (cudaError {})",
            what,
            why.to_string_lossy(),
            code
        ))
    }

    /// The number of CUDA devices; Err when there is none (or no driver), saying why.
    pub fn device_count(&self) -> Result<i32, String> {
        let mut n = 0;
        self.check(
            unsafe { (self.get_device_count)(&mut n) },
            "cudaGetDeviceCount",
        )?;
        if n == 0 {
            return Err("cudaGetDeviceCount found no device".to_string());
        }
        Ok(n)
    }

    /// Makes `device` current on this thread (allocations and streams go there).
    pub fn set_device(&self, device: i32) -> Result<(), String> {
        self.check(unsafe { (self.set_device)(device) }, "cudaSetDevice")
    }

    /// `bytes` of device memory on the current device, freed on drop.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer<'_>, String> {
        let mut ptr = std::ptr::null_mut();
        self.check(unsafe { (self.malloc)(&mut ptr, bytes) }, "cudaMalloc")?;
        Ok(DeviceBuffer {
            rt: self,
            ptr,
            bytes,
        })
    }

    /// A new stream of the current device, destroyed on drop.
    pub fn stream(&self) -> Result<Stream<'_>, String> {
        let mut raw = std::ptr::null_mut();
        self.check(
            unsafe { (self.stream_create)(&mut raw) },
            "cudaStreamCreate",
        )?;
        Ok(Stream { rt: self, raw })
    }
}

/// Device memory from cudaMalloc.
pub struct DeviceBuffer<'a> {
    rt: &'a Cudart,
    ptr: *mut c_void,
    bytes: usize,
}

impl DeviceBuffer<'_> {
    /// The device address.
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // cudaFree waits for the device to finish with the memory first.
        unsafe { (self.rt.free)(self.ptr) };
    }
}

/// A CUDA stream (`cudaStream_t`).
pub struct Stream<'a> {
    rt: &'a Cudart,
    raw: *mut c_void,
}

impl Stream<'_> {
    /// The `cudaStream_t`, as `Optimizer::step_on` takes it.
    pub fn raw(&self) -> *mut c_void {
        self.raw
    }

    /// Enqueues a copy of `src` into the device memory at `dst` (which holds at least
    /// `src`'s bytes). `src` must stay as it is until the stream has run the copy.
    pub fn upload<T: Copy>(&self, dst: *mut c_void, src: &[T]) -> Result<(), String> {
        let bytes = std::mem::size_of_val(src);
        self.rt.check(
            unsafe {
                (self.rt.memcpy_async)(
                    dst,
                    src.as_ptr() as *const c_void,
                    bytes,
                    MEMCPY_HOST_TO_DEVICE,
                    self.raw,
                )
            },
            "cudaMemcpyAsync (host to device)",
        )
    }

    /// Copies the device memory at `src` into `dst` once the stream's earlier work is done,
    /// and waits for it.
    pub fn download<T: Copy>(&self, dst: &mut [T], src: *const c_void) -> Result<(), String> {
        let bytes = std::mem::size_of_val(dst);
        self.rt.check(
            unsafe {
                (self.rt.memcpy_async)(
                    dst.as_mut_ptr() as *mut c_void,
                    src,
                    bytes,
                    MEMCPY_DEVICE_TO_HOST,
                    self.raw,
                )
            },
            "cudaMemcpyAsync (device to host)",
        )?;
        self.synchronize()
    }

    /// Waits until the stream has run everything enqueued on it.
    pub fn synchronize(&self) -> Result<(), String> {
        self.rt.check(
            unsafe { (self.rt.stream_synchronize)(self.raw) },
            "cudaStreamSynchronize",
        )
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        unsafe { (self.rt.stream_destroy)(self.raw) };
    }
}
