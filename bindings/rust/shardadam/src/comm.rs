//! Communicators: how the ranks of a job agree on the global gradient norm and on a
//! found-inf flag (`sa_comm`).

use crate::{handleless_result, Error, Result, Status};
use shardadam_sys as sys;
use std::cell::RefCell;
use std::fmt;
use std::os::raw::{c_int, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::Mutex;

/// The reduction a host communicator's callback applies (`sa_reduce_op`): element-wise
/// over all ranks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum (partial L2 norms, squared).
    Sum,
    /// The maximum (inf norms and found-inf flags under the inf norm).
    Max,
}

/// The 128 bytes that let ranks join one NCCL communicator (`sa_nccl_unique_id`): rank 0
/// makes it with [`Comm::nccl_unique_id`], the job sends its bytes to the other ranks.
#[derive(Copy, Clone, PartialEq, Eq)]
pub struct NcclUniqueId([u8; 128]);

impl NcclUniqueId {
    /// The id's bytes, to send to the other ranks.
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.0
    }

    /// An id from the bytes another rank sent.
    pub fn from_bytes(bytes: [u8; 128]) -> NcclUniqueId {
        NcclUniqueId(bytes)
    }

    fn raw(&self) -> sys::sa_nccl_unique_id {
        let mut raw = sys::sa_nccl_unique_id { internal: [0; 128] };
        for (dst, &src) in raw.internal.iter_mut().zip(self.0.iter()) {
            *dst = src as _;
        }
        raw
    }
}

impl fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The bytes are a secret of sorts (a socket address and a magic); no need to print them.
        f.write_str("NcclUniqueId(..)")
    }
}

/// A communicator over the ranks of a training job: the whole mesh, every rank that holds
/// a part of the optimizers' params. Give it to each rank's optimizer with
/// [`crate::Optimizer::set_comm`]; a step that computes a norm or carries a found-inf flag
/// then all-reduces two doubles through it, so every rank clips by the same global norm
/// and skips together.
///
/// Dropping a `Comm` releases this handle only: an optimizer it was given to keeps it alive
/// (and a host communicator's closure with it) until the optimizer is dropped or given
/// another one.
pub struct Comm {
    raw: NonNull<sys::sa_comm>,
}

// SAFETY: the handle is a reference count the library manages; a host communicator's
// closure is Send and called under a mutex, so the handle may move between threads.
unsafe impl Send for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        unsafe { sys::sa_comm_destroy(self.raw.as_ptr()) };
    }
}

/// What a host communicator's C context points to: the user's closure, type-erased.
struct HostComm {
    // A Mutex, not a RefCell: one communicator may be given to several optimizers, and
    // those may step on different threads. The closure then runs for one at a time.
    all_reduce: Mutex<Box<HostAllReduce>>,
    // Comm::host_exchanging's: the all_to_all closure, and the length of its size slices.
    all_to_all: Option<Mutex<Box<HostAllToAll>>>,
    nranks: usize,
}

type HostAllReduce = dyn FnMut(&mut [f64], ReduceOp) -> std::result::Result<(), String> + Send;
type HostAllToAll =
    dyn FnMut(&[u8], &[i64], &mut [u8], &[i64]) -> std::result::Result<(), String> + Send;

thread_local! {
    // Why the last host callback on this thread failed. The library calls all_reduce on
    // the thread that called sa_optimizer_step, so Optimizer::step_with reads it right
    // after the step and adds it to the library's "returned 1".
    static CALLBACK_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Forgets the reason of an earlier failed callback on this thread.
pub(crate) fn clear_callback_error() {
    CALLBACK_ERROR.with(|e| e.borrow_mut().take());
}

/// The reason the last host callback on this thread failed, if one did since the last
/// [`clear_callback_error`].
pub(crate) fn take_callback_error() -> Option<String> {
    CALLBACK_ERROR.with(|e| e.borrow_mut().take())
}

fn set_callback_error(message: String) {
    CALLBACK_ERROR.with(|e| *e.borrow_mut() = Some(message));
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string payload".to_string()
    }
}

/// `sa_host_comm.all_reduce`. Returns 0 on success, 1 when the closure returned an error,
/// 2 when it panicked (a panic must not unwind into C), 3 for arguments the C contract
/// rules out.
unsafe extern "C" fn host_all_reduce(
    ctx: *mut c_void,
    values: *mut f64,
    count: i32,
    op: sys::sa_reduce_op,
) -> c_int {
    let op = match op {
        sys::SA_REDUCE_SUM => ReduceOp::Sum,
        sys::SA_REDUCE_MAX => ReduceOp::Max,
        other => {
            set_callback_error(format!("the library asked for reduce op {}", other));
            return 3;
        }
    };
    if ctx.is_null() || count < 0 || (values.is_null() && count > 0) {
        set_callback_error(format!(
            "all_reduce called with ctx {:?}, values {:?}, count {}",
            ctx, values, count
        ));
        return 3;
    }
    let host = &*(ctx as *const HostComm);
    let values: &mut [f64] = if count == 0 {
        &mut []
    } else {
        // SAFETY: the library passes `count` doubles of host memory, ours for the call.
        std::slice::from_raw_parts_mut(values, count as usize)
    };
    run_guarded("all_reduce", || {
        // A closure that panicked earlier poisoned nothing of ours: the panic was caught
        // below the lock. Take the lock even so.
        let mut all_reduce = host.all_reduce.lock().unwrap_or_else(|p| p.into_inner());
        (*all_reduce)(values, op)
    })
}

/// Runs a host closure: 0 on success, 1 when it returned an error, 2 when it panicked (a
/// panic must not unwind into C); the reason kept for the step's error.
fn run_guarded(what: &str, f: impl FnOnce() -> std::result::Result<(), String>) -> c_int {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(message)) => {
            set_callback_error(message);
            1
        }
        Err(payload) => {
            set_callback_error(format!(
                "the {} closure panicked: {}",
                what,
                panic_message(&*payload)
            ));
            2
        }
    }
}

/// `sa_host_comm.all_to_all`, its results as [`host_all_reduce`]'s.
unsafe extern "C" fn host_all_to_all(
    ctx: *mut c_void,
    send: *const c_void,
    send_bytes: *const i64,
    recv: *mut c_void,
    recv_bytes: *const i64,
) -> c_int {
    if ctx.is_null() || send_bytes.is_null() || recv_bytes.is_null() {
        set_callback_error("all_to_all called with a NULL pointer".to_string());
        return 3;
    }
    let host = &*(ctx as *const HostComm);
    let all_to_all = match host.all_to_all.as_ref() {
        Some(f) => f,
        None => {
            set_callback_error("all_to_all called on a communicator without one".to_string());
            return 3;
        }
    };
    // SAFETY: the library passes nranks sizes each way and blocks of their sums (host
    // memory, ours for the call).
    let sent = std::slice::from_raw_parts(send_bytes, host.nranks);
    let received = std::slice::from_raw_parts(recv_bytes, host.nranks);
    let total = |sizes: &[i64]| sizes.iter().map(|&s| s.max(0) as usize).sum::<usize>();
    let out: &[u8] = match total(sent) {
        0 => &[],
        n => std::slice::from_raw_parts(send as *const u8, n),
    };
    let into: &mut [u8] = match total(received) {
        0 => &mut [],
        n => std::slice::from_raw_parts_mut(recv as *mut u8, n),
    };
    run_guarded("all_to_all", || {
        let mut f = all_to_all.lock().unwrap_or_else(|p| p.into_inner());
        (*f)(out, sent, into, received)
    })
}

/// `sa_host_comm.release`: frees the closure when the library drops its last reference.
unsafe extern "C" fn host_release(ctx: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    // Dropping the closure runs the user's destructors; a panic there must not reach C.
    let _ = panic::catch_unwind(AssertUnwindSafe(|| {
        drop(Box::from_raw(ctx as *mut HostComm));
    }));
}

impl Comm {
    /// A communicator made of a closure (`sa_comm_create_host`): the caller's own
    /// transport (MPI, sockets, threads of one process), for CPU training.
    ///
    /// At every communicating step the library calls `all_reduce` once, on the thread that
    /// called the step, with the values to reduce (this rank's partial norm and found-inf
    /// flag). It must replace each value with its element-wise `op` over all ranks, in
    /// place; every rank is called with the same length and op. An `Err` (its text
    /// becomes part of the step's error) or a panic (caught: it never unwinds into C)
    /// fails the step with [`Status::Comm`] before this rank updated anything (but while
    /// split Muon matrices are carried, which comes after the update: the other params
    /// stepped).
    ///
    /// Create one communicator per rank. If it is given to several optimizers, their
    /// steps call the closure one at a time.
    ///
    /// ```
    /// use shardadam::{Comm, GroupConfig, Optimizer, ReduceOp, StepArgs};
    ///
    /// // A job of one rank: the reduction over all ranks leaves the values as they are.
    /// let comm = Comm::host(|_values: &mut [f64], _op: ReduceOp| Ok::<(), String>(()))?;
    /// let mut opt = Optimizer::new(None)?;
    /// opt.add_group(&GroupConfig::new())?;
    /// let w = opt.add_param("w", 0, &[2], vec![1.0, 2.0], None)?;
    /// opt.set_grad(w, &[3.0, 4.0])?;
    /// opt.set_comm(&comm)?;
    /// let clip = StepArgs { max_grad_norm: Some(1.0), ..StepArgs::default() };
    /// assert_eq!(opt.step_with(&clip)?.grad_norm, Some(5.0));
    /// # Ok::<(), shardadam::Error>(())
    /// ```
    pub fn host<F, E>(all_reduce: F) -> Result<Comm>
    where
        F: FnMut(&mut [f64], ReduceOp) -> std::result::Result<(), E> + Send + 'static,
        E: fmt::Display,
    {
        Comm::host_with(0, 0, all_reduce, None)
    }

    /// [`Comm::host`] for a transport whose ranks are numbered: this is rank `rank` of
    /// `nranks` (`0 <= rank < nranks`, each number on one rank). Each Muon matrix split
    /// across ranks is then orthogonalized on one owner rank instead of on every rank, its
    /// parts carried there and back by `all_reduce` (every rank's to every rank:
    /// [`Comm::host_exchanging`] carries only each rank's own); the first step checks
    /// that the ranks' numbers make `0..nranks` once each ([`Status::Mismatch`] otherwise). A `rank` outside
    /// `0..nranks` is refused with [`Status::InvalidArgument`]; `nranks` 0 (with `rank` 0)
    /// says nothing, as [`Comm::host`].
    pub fn host_ranked<F, E>(rank: i32, nranks: i32, all_reduce: F) -> Result<Comm>
    where
        F: FnMut(&mut [f64], ReduceOp) -> std::result::Result<(), E> + Send + 'static,
        E: fmt::Display,
    {
        Comm::host_with(rank, nranks, all_reduce, None)
    }

    /// [`Comm::host_ranked`] whose `all_to_all` carries the split Muon matrices' parts,
    /// each rank's to their owners and back (`sa_host_comm.all_to_all`), instead of
    /// `all_reduce` carrying every rank's to every rank: the same results, with memory and
    /// traffic that do not grow with the rank count. `all_to_all(send, send_bytes, recv,
    /// recv_bytes)` sends `send_bytes[r]` bytes of `send` to each rank `r` and fills `recv`
    /// with `recv_bytes[r]` from each, the blocks in rank order (as `MPI_Alltoallv`); every
    /// rank calls it at the same time. An `Err` or a panic fails the step with
    /// [`Status::Comm`].
    pub fn host_exchanging<F, E, A, AE>(
        rank: i32,
        nranks: i32,
        all_reduce: F,
        all_to_all: A,
    ) -> Result<Comm>
    where
        F: FnMut(&mut [f64], ReduceOp) -> std::result::Result<(), E> + Send + 'static,
        E: fmt::Display,
        A: FnMut(&[u8], &[i64], &mut [u8], &[i64]) -> std::result::Result<(), AE> + Send + 'static,
        AE: fmt::Display,
    {
        let mut all_to_all = all_to_all;
        let erased: Box<HostAllToAll> = Box::new(
            move |send: &[u8], sent: &[i64], recv: &mut [u8], received: &[i64]| {
                all_to_all(send, sent, recv, received).map_err(|e| e.to_string())
            },
        );
        Comm::host_with(rank, nranks, all_reduce, Some(erased))
    }

    fn host_with<F, E>(
        rank: i32,
        nranks: i32,
        all_reduce: F,
        all_to_all: Option<Box<HostAllToAll>>,
    ) -> Result<Comm>
    where
        F: FnMut(&mut [f64], ReduceOp) -> std::result::Result<(), E> + Send + 'static,
        E: fmt::Display,
    {
        let mut all_reduce = all_reduce;
        let erased: Box<HostAllReduce> = Box::new(move |values: &mut [f64], op: ReduceOp| {
            all_reduce(values, op).map_err(|e| e.to_string())
        });
        let exchanging = all_to_all.is_some();
        let ctx = Box::into_raw(Box::new(HostComm {
            all_reduce: Mutex::new(erased),
            all_to_all: all_to_all.map(Mutex::new),
            nranks: nranks.max(0) as usize,
        }));
        let callbacks = sys::sa_host_comm {
            ctx: ctx as *mut c_void,
            all_reduce: Some(host_all_reduce),
            release: Some(host_release),
            rank,
            nranks,
            all_to_all: if exchanging {
                Some(host_all_to_all)
            } else {
                None
            },
            ..sys::sa_host_comm::default()
        };
        let mut raw = ptr::null_mut();
        if let Err(e) = handleless_result(unsafe { sys::sa_comm_create_host(&callbacks, &mut raw) })
        {
            // A refused table is not kept, so release is never called: free ctx here.
            drop(unsafe { Box::from_raw(ctx) });
            return Err(e);
        }
        Comm::from_raw(raw, "sa_comm_create_host")
    }

    /// Makes a new NCCL unique id (`sa_nccl_unique_id_create`) on rank 0.
    /// [`Status::Unsupported`] when the library was built without NCCL
    /// ([`crate::build_info`] says `nccl: not available`) or NCCL cannot be loaded.
    pub fn nccl_unique_id() -> Result<NcclUniqueId> {
        let mut raw = sys::sa_nccl_unique_id { internal: [0; 128] };
        handleless_result(unsafe { sys::sa_nccl_unique_id_create(&mut raw) })?;
        let mut bytes = [0u8; 128];
        for (dst, &src) in bytes.iter_mut().zip(raw.internal.iter()) {
            *dst = src as u8;
        }
        Ok(NcclUniqueId(bytes))
    }

    /// An NCCL communicator of `nranks` ranks on CUDA device `device`, as rank `rank`
    /// (`sa_comm_create_nccl`, ncclCommInitRank). Collective: it returns once all ranks
    /// have called it with the same id. For optimizers of CUDA params on that device: it
    /// reduces in device memory on the step's stream.
    pub fn nccl(id: &NcclUniqueId, nranks: i32, rank: i32, device: i32) -> Result<Comm> {
        let raw_id = id.raw();
        let mut raw = ptr::null_mut();
        handleless_result(unsafe {
            sys::sa_comm_create_nccl(&raw_id, nranks, rank, device, &mut raw)
        })?;
        Comm::from_raw(raw, "sa_comm_create_nccl")
    }

    /// Wraps an NCCL communicator the caller already has (`sa_comm_wrap_nccl`).
    ///
    /// # Safety
    ///
    /// `nccl_comm` must be a valid `ncclComm_t`, kept alive (not destroyed, not aborted)
    /// until every optimizer it was given to is dropped or given another communicator, and
    /// not used for other work while a step runs.
    pub unsafe fn wrap_nccl(nccl_comm: *mut c_void) -> Result<Comm> {
        let mut raw = ptr::null_mut();
        handleless_result(sys::sa_comm_wrap_nccl(nccl_comm, &mut raw))?;
        Comm::from_raw(raw, "sa_comm_wrap_nccl")
    }

    fn from_raw(raw: *mut sys::sa_comm, function: &str) -> Result<Comm> {
        NonNull::new(raw)
            .map(|raw| Comm { raw })
            .ok_or_else(|| Error {
                status: Status::Internal,
                message: format!("{} returned SA_OK and no communicator", function),
            })
    }

    /// This rank and the number of ranks (`sa_comm_info`); `None` for a host communicator
    /// made without them ([`Comm::host`]).
    pub fn rank_and_size(&self) -> Result<Option<(i32, i32)>> {
        let (mut rank, mut nranks) = (-1i32, -1i32);
        handleless_result(unsafe { sys::sa_comm_info(self.raw.as_ptr(), &mut rank, &mut nranks) })?;
        Ok(if rank < 0 { None } else { Some((rank, nranks)) })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::sa_comm {
        self.raw.as_ptr()
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rank_and_size() {
            Ok(Some((rank, nranks))) => write!(f, "Comm(rank {} of {})", rank, nranks),
            _ => f.write_str("Comm(host)"),
        }
    }
}
