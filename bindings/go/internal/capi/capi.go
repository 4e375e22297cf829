// Package capi is the native layer under package shardadam: the SWIG-generated wrappers of
// the C helpers in capi.swig (go build runs SWIG on it), plus C memory allocation for the
// buffers shardadam keeps pointers to, and the Go ends of the host communicator's C
// callbacks. It is internal: use package shardadam.
package capi

/*
#cgo CFLAGS: -I${SRCDIR}/../../../../include
#cgo LDFLAGS: -lshardadam
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// Alloc returns n zeroed bytes of C memory (malloc-aligned, so aligned for every dtype
// shardadam takes), or nil when the allocation fails. n == 0 still allocates one byte so
// that an empty shard has a non-NULL data pointer. Free it with Free, unless ownership
// passed to shardadam (a param's data, freed by its DLPack deleter).
func Alloc(n int64) unsafe.Pointer {
	if n < 1 {
		n = 1
	}
	return C.calloc(1, C.size_t(n))
}

// Free releases memory from Alloc. Free(nil) does nothing.
func Free(p unsafe.Pointer) {
	C.free(p)
}

// HostAllReduce is what the cgo.Handle of a host communicator (Sago_comm_create_host)
// holds: it reduces values in place across the ranks with op (0 sum, 1 max) and returns 0,
// or nonzero on failure. It must not panic: C frames lie between it and the Go caller.
type HostAllReduce func(values []float64, op int) int

// sagoHostAllReduce is the Go end of sa_host_comm.all_reduce: it calls the HostAllReduce
// behind the handle on the library's values (C memory, valid for the call).
//
//export sagoHostAllReduce
func sagoHostAllReduce(handle C.uintptr_t, values *C.double, count C.int32_t, op C.int) (rc C.int) {
	// The last line of defence: a panic must not unwind through the library's C++ frames.
	defer func() {
		if recover() != nil {
			rc = 2
		}
	}()
	allReduce, ok := cgo.Handle(handle).Value().(HostAllReduce)
	if !ok || count < 0 || (values == nil && count > 0) {
		return 3
	}
	var slice []float64
	if count > 0 {
		slice = unsafe.Slice((*float64)(unsafe.Pointer(values)), int(count))
	}
	return C.int(allReduce(slice, int(op)))
}

// sagoHostRelease is the Go end of sa_host_comm.release: the library dropped its last
// reference, so the handle (and with it the Go function) is let go.
//
//export sagoHostRelease
func sagoHostRelease(handle C.uintptr_t) {
	cgo.Handle(handle).Delete()
}
