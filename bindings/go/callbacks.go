package shardadam

// The Go functions the library calls back: a host communicator's all_reduce and release,
// and the deleter of the param shards this package hands over. They are C function
// pointers in the library's tables, so they are exported to C; the file that exports may
// only declare in its preamble.

/*
#include <shardadam/shardadam.h>

extern int sagoHostAllReduce(void* ctx, double* values, int32_t count, sa_reduce_op op);
extern int sagoHostAllToAll(void* ctx, void* send, int64_t* send_bytes, void* recv, int64_t* recv_bytes);
extern void sagoHostRelease(void* ctx);
extern void sagoShardDeleter(DLManagedTensorVersioned* self);
#include <stdlib.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// hostCallbacks is the callback table of a host communicator whose ctx is a C cell
// holding the cgo.Handle of its *hostComm; allToAll: with sagoHostAllToAll.
func hostCallbacks(ctx unsafe.Pointer, allToAll bool) C.sa_host_comm {
	callbacks := C.sa_host_comm{struct_size: C.sizeof_sa_host_comm, ctx: ctx,
		all_reduce: (*[0]byte)(C.sagoHostAllReduce), release: (*[0]byte)(C.sagoHostRelease)}
	if allToAll {
		callbacks.all_to_all = (*[0]byte)(C.sagoHostAllToAll)
	}
	return callbacks
}

// sagoHostAllReduce is sa_host_comm.all_reduce: it calls the Go function behind ctx on the
// library's values (C memory, valid for the call).
//
//export sagoHostAllReduce
func sagoHostAllReduce(ctx unsafe.Pointer, values *C.double, count C.int32_t, op C.sa_reduce_op) (rc C.int) {
	// The last line of defence: a panic must not unwind through the library's C++ frames.
	defer func() {
		if recover() != nil {
			rc = 2
		}
	}()
	host, ok := cgo.Handle(*(*C.uintptr_t)(ctx)).Value().(*hostComm)
	if !ok || count < 0 || (values == nil && count > 0) {
		return 3
	}
	var slice []float64
	if count > 0 {
		slice = unsafe.Slice((*float64)(unsafe.Pointer(values)), int(count))
	}
	return C.int(host.call(slice, int(op)))
}

// sagoHostAllToAll is sa_host_comm.all_to_all: it calls the AllToAll behind ctx on the
// library's blocks (C memory, valid for the call).
//
//export sagoHostAllToAll
func sagoHostAllToAll(ctx unsafe.Pointer, send unsafe.Pointer, sendBytes *C.int64_t, recv unsafe.Pointer,
	recvBytes *C.int64_t) (rc C.int) {
	defer func() {
		if recover() != nil {
			rc = 2
		}
	}()
	host, ok := cgo.Handle(*(*C.uintptr_t)(ctx)).Value().(*hostComm)
	if !ok || host.allToAll == nil {
		return 3
	}
	n := host.nranks
	sent := unsafe.Slice((*int64)(unsafe.Pointer(sendBytes)), n)
	received := unsafe.Slice((*int64)(unsafe.Pointer(recvBytes)), n)
	total := func(sizes []int64) (t int) {
		for _, s := range sizes {
			t += int(s)
		}
		return t
	}
	var out, in []byte
	if k := total(sent); k > 0 {
		out = unsafe.Slice((*byte)(send), k)
	}
	if k := total(received); k > 0 {
		in = unsafe.Slice((*byte)(recv), k)
	}
	return C.int(host.exchange(out, sent, in, received))
}

// sagoHostRelease is sa_host_comm.release: the library dropped its last reference, so the
// handle (and with it the Go function) is let go.
//
//export sagoHostRelease
func sagoHostRelease(ctx unsafe.Pointer) {
	cgo.Handle(*(*C.uintptr_t)(ctx)).Delete()
	C.free(ctx)
}

// shardDeleter is the DLPack deleter of the shards addParam hands over.
func shardDeleter() *[0]byte { return (*[0]byte)(C.sagoShardDeleter) }

// sagoShardDeleter frees a shard's C block and the data the optimizer owns (manager_ctx,
// NULL for the caller's memory).
//
//export sagoShardDeleter
func sagoShardDeleter(self *C.DLManagedTensorVersioned) {
	C.free(self.manager_ctx)
	C.free(unsafe.Pointer(self))
}
