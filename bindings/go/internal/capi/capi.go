// Package capi is the native layer under package shardadam: the SWIG-generated wrappers of
// the C helpers in capi.swig (go build runs SWIG on it), plus C memory allocation for the
// buffers shardadam keeps pointers to. It is internal: use package shardadam.
package capi

/*
#cgo CFLAGS: -I${SRCDIR}/../../../../include
#cgo LDFLAGS: -lshardadam
#include <stdlib.h>
*/
import "C"

import "unsafe"

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
