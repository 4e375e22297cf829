package shardadam

// #include <stdlib.h>
// #include <shardadam/shardadam.h>
import "C"

import (
	"fmt"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// ReduceOp is the reduction a host communicator's function applies (sa_reduce_op),
// element-wise over all ranks.
type ReduceOp int

// The reductions.
const (
	ReduceSum ReduceOp = 0 // the sum (partial L2 norms, squared)
	ReduceMax ReduceOp = 1 // the maximum (inf norms)
)

// String returns "sum" or "max".
func (op ReduceOp) String() string {
	switch op {
	case ReduceSum:
		return "sum"
	case ReduceMax:
		return "max"
	}
	return fmt.Sprintf("ReduceOp(%d)", int(op))
}

// NormType is the norm that StepArgs.MaxGradNorm bounds (sa_norm_type).
type NormType int

// The norms.
const (
	NormL2  NormType = 0 // the square root of the sum of squares of all grad elements
	NormInf NormType = 1 // the largest absolute grad element
)

// Comm is a communicator over the ranks of a training job: the whole mesh, every rank that
// holds a part of the optimizers' params. Give it to each rank's optimizer with
// (*Optimizer).SetComm; a step that computes a norm or carries a found-inf flag then
// all-reduces two float64s through it, so every rank clips by the same global norm and
// skips together.
//
// Close releases this handle only: an optimizer it was given to keeps the communicator
// (and a host communicator's function) alive until the optimizer is closed or given
// another one.
type Comm struct {
	mu     sync.Mutex
	handle *C.sa_comm // nil once closed
	host   *hostComm  // nil for NCCL communicators
}

// hostComm is the Go side of a host communicator: the user's function and why its last
// call failed.
type hostComm struct {
	allReduce func(values []float64, op ReduceOp) error
	allToAll  AllToAll // nil: the library exchanges through allReduce
	nranks    int      // the length of allToAll's size slices
	mu        sync.Mutex
	lastError string
}

// AllToAll sends sendBytes[r] bytes of send to each rank r and fills recv with
// recvBytes[r] bytes from each rank r, the blocks one after another in rank order, as
// MPI_Alltoallv does (sa_host_comm.all_to_all); the sizes for this rank are 0. Every rank
// calls it at the same time, and rank q's sendBytes[r] equals rank r's recvBytes[q]. The
// slices are C memory, valid only during the call.
type AllToAll func(send []byte, sendBytes []int64, recv []byte, recvBytes []int64) error

// call runs the function for sagoHostAllReduce: 0 on success, 1 when the function
// returned an error, 2 when it panicked (recovered: C frames lie between it and the
// step's caller).
func (h *hostComm) call(values []float64, op int) int {
	return h.guard("all-reduce", func() error { return h.allReduce(values, ReduceOp(op)) })
}

// exchange runs allToAll for sagoHostAllToAll, its results as call's.
func (h *hostComm) exchange(send []byte, sendBytes []int64, recv []byte, recvBytes []int64) int {
	return h.guard("all-to-all", func() error { return h.allToAll(send, sendBytes, recv, recvBytes) })
}

func (h *hostComm) guard(what string, f func() error) (rc int) {
	defer func() {
		if r := recover(); r != nil {
			h.setError(fmt.Sprintf("the %s function panicked: %v", what, r))
			rc = 2
		}
	}()
	if err := f(); err != nil {
		h.setError(err.Error())
		return 1
	}
	return 0
}

func (h *hostComm) setError(message string) {
	h.mu.Lock()
	h.lastError = message
	h.mu.Unlock()
}

// takeError returns why the last call failed ("" if it did not) and forgets it.
func (h *hostComm) takeError() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	message := h.lastError
	h.lastError = ""
	return message
}

// NewHostComm returns a communicator made of a Go function (sa_comm_create_host): the
// caller's own transport (MPI, sockets, goroutines of one process), for CPU training.
//
// At every communicating step the library calls allReduce once, on the goroutine that
// called the step, with this rank's values (its partial norm and found-inf flag). It must
// replace each value with its element-wise op over all ranks, in place; every rank is
// called with the same length and op. values is C memory, valid only during the call. An
// error (its text becomes part of the step's error) or a panic (recovered) fails the step
// with StatusComm before this rank updated anything (but while split Muon matrices are
// carried, which comes after the update: the other params stepped).
//
// Create one communicator per rank. Given to several optimizers that step at once, the
// function is called concurrently.
func NewHostComm(allReduce func(values []float64, op ReduceOp) error) (*Comm, error) {
	return newHostComm(0, 0, allReduce, nil)
}

// NewRankedHostComm is NewHostComm for a transport whose ranks are numbered: this is rank
// rank of nranks (0 <= rank < nranks, each number on one rank). Each Muon matrix split
// across ranks is then orthogonalized on one owner rank instead of on every rank, its parts
// carried there and back by allReduce (every rank's to every rank: the C ABI's
// sa_host_comm.all_to_all carries only each rank's own); the first step checks that the
// ranks' numbers make 0..nranks-1 once each (StatusMismatch otherwise). A rank outside 0..nranks-1
// is refused with StatusInvalidArgument; nranks 0 (with rank 0) says nothing, as NewHostComm.
func NewRankedHostComm(rank, nranks int, allReduce func(values []float64, op ReduceOp) error) (*Comm, error) {
	return newHostComm(rank, nranks, allReduce, nil)
}

// NewExchangingHostComm is NewRankedHostComm whose allToAll carries the split Muon matrices'
// parts, each rank's to their owners and back, instead of allReduce carrying every rank's to
// every rank: the same results, with memory and traffic that do not grow with the rank
// count. An error or a panic of allToAll fails the step with StatusComm.
func NewExchangingHostComm(rank, nranks int, allReduce func(values []float64, op ReduceOp) error,
	allToAll AllToAll) (*Comm, error) {
	if allToAll == nil {
		return nil, bindingError(StatusInvalidArgument, "shardadam.NewExchangingHostComm: allToAll is nil")
	}
	return newHostComm(rank, nranks, allReduce, allToAll)
}

func newHostComm(rank, nranks int, allReduce func(values []float64, op ReduceOp) error, allToAll AllToAll) (*Comm, error) {
	if allReduce == nil {
		return nil, bindingError(StatusInvalidArgument, "shardadam.NewHostComm: allReduce is nil")
	}
	if rank != int(int32(rank)) || nranks != int(int32(nranks)) {
		return nil, bindingError(StatusInvalidArgument, fmt.Sprintf(
			"shardadam.NewRankedHostComm: rank %d or nranks %d does not fit an int32", rank, nranks))
	}
	host := &hostComm{allReduce: allReduce, allToAll: allToAll, nranks: nranks}
	// C keeps the handle, an integer in a C cell, never a Go pointer; release deletes both.
	ctx := (*C.uintptr_t)(C.malloc(C.size_t(unsafe.Sizeof(C.uintptr_t(0)))))
	if ctx == nil {
		return nil, bindingError(StatusOutOfMemory, "shardadam.NewHostComm: cannot allocate the callbacks' context")
	}
	h := cgo.NewHandle(host)
	*ctx = C.uintptr_t(h)
	callbacks := hostCallbacks(unsafe.Pointer(ctx), allToAll != nil)
	callbacks.rank, callbacks.nranks = C.int32_t(rank), C.int32_t(nranks)
	var handle *C.sa_comm
	if err := handleless(func() C.sa_status { return C.sa_comm_create_host(&callbacks, &handle) }); err != nil {
		h.Delete() // a refused table is not kept, so release never runs
		C.free(unsafe.Pointer(ctx))
		return nil, err
	}
	return &Comm{handle: handle, host: host}, nil
}

// NCCLUniqueID is the 128 bytes that let ranks join one NCCL communicator: rank 0 makes
// it with NewNCCLUniqueID, the job sends it to the other ranks.
type NCCLUniqueID [128]byte

// NewNCCLUniqueID makes a new NCCL unique id (sa_nccl_unique_id_create). StatusUnsupported
// when the library has no NCCL (BuildInfo says "nccl: not available") or NCCL cannot be loaded.
func NewNCCLUniqueID() (NCCLUniqueID, error) {
	var raw C.sa_nccl_unique_id
	err := handleless(func() C.sa_status { return C.sa_nccl_unique_id_create(&raw) })
	var id NCCLUniqueID
	copy(id[:], unsafe.Slice((*byte)(unsafe.Pointer(&raw.internal[0])), len(id)))
	return id, err
}

// NewNCCLComm creates an NCCL communicator of nranks ranks on CUDA device `device`, as rank
// `rank` (sa_comm_create_nccl, ncclCommInitRank). Collective: it returns once all ranks
// have called it with the same id. It reduces in device memory on the step's stream, for
// optimizers of CUDA params on that device.
func NewNCCLComm(id NCCLUniqueID, nranks, rank, device int) (*Comm, error) {
	var raw C.sa_nccl_unique_id
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&raw.internal[0])), len(id)), id[:])
	var handle *C.sa_comm
	if err := handleless(func() C.sa_status {
		return C.sa_comm_create_nccl(&raw, C.int32_t(nranks), C.int32_t(rank), C.int32_t(device), &handle)
	}); err != nil {
		return nil, err
	}
	return &Comm{handle: handle}, nil
}

// WrapNCCLComm wraps an NCCL communicator the caller already has (an ncclComm_t;
// sa_comm_wrap_nccl). It is borrowed: keep it alive (not destroyed, not aborted) until
// every optimizer it was given to is closed or given another communicator, and run no
// other work on it while a step runs.
func WrapNCCLComm(ncclComm unsafe.Pointer) (*Comm, error) {
	var handle *C.sa_comm
	if err := handleless(func() C.sa_status { return C.sa_comm_wrap_nccl(ncclComm, &handle) }); err != nil {
		return nil, err
	}
	return &Comm{handle: handle}, nil
}

// RankAndSize returns this rank and the number of ranks (sa_comm_info); -1, -1 for a host
// communicator made without them (NewHostComm).
func (c *Comm) RankAndSize() (rank, nranks int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.handle == nil {
		return -1, -1, bindingError(StatusState, "shardadam.Comm.RankAndSize: the communicator is closed")
	}
	r, n := C.int32_t(-1), C.int32_t(-1)
	if err := handleless(func() C.sa_status { return C.sa_comm_info(c.handle, &r, &n) }); err != nil {
		return -1, -1, err
	}
	return int(r), int(n), nil
}

// Close releases the caller's reference (sa_comm_destroy). Optimizers given the
// communicator keep it alive. Closing twice is a no-op; it always returns nil.
func (c *Comm) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.handle != nil {
		C.sa_comm_destroy(c.handle)
		c.handle = nil
	}
	return nil
}

// SetComm gives the optimizer a communicator for its steps (sa_optimizer_set_comm),
// replacing any earlier one; nil takes it away (steps are rank-local again). The optimizer
// keeps it alive, so c may be closed afterwards. From then on a step with a norm or a
// found-inf flag is collective (see StepArgs). A CPU optimizer needs a host communicator;
// an NCCL one must be on the optimizer's CUDA device (checked at the step: StatusMismatch).
func (o *Optimizer) SetComm(c *Comm) error {
	const op = "shardadam.SetComm"
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	if c == nil {
		if err := o.check(C.sa_optimizer_set_comm(o.handle, nil)); err != nil {
			return err
		}
		o.comm = nil
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.handle == nil {
		return bindingError(StatusState, "%s: the communicator is closed", op)
	}
	if err := o.check(C.sa_optimizer_set_comm(o.handle, c.handle)); err != nil {
		return err
	}
	o.comm = c
	return nil
}
