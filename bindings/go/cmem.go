package shardadam

/*
#cgo pkg-config: shardadam
#include <stdlib.h>
#include <shardadam/shardadam.h>
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// This package calls shardadam.h directly through cgo; these are the rules it keeps.
//
// Error text: a failed call on an optimizer leaves its message on the handle
// (sa_optimizer_last_error), which the Optimizer's mutex keeps from being overwritten
// before it is read. Handle-less calls keep theirs in a thread-local string, and Go may
// move a goroutine to another OS thread between two cgo calls, so those run with the
// goroutine locked to its thread (handleless) until the message is read.
//
// Pointers: C must not keep a Go pointer after a call, and Go memory handed to C must
// not hold Go pointers. So everything the library keeps (param data, grad buffers, the
// step arguments) and every struct that points somewhere (layouts, DLTensors, reader
// lists) lives in C memory. Device addresses never sit in memory the Go collector scans
// either: they are written into C structs as integers.

// cArena is C memory for one call's structs, released together by free.
type cArena []unsafe.Pointer

// alloc returns n zeroed bytes of C memory (at least 1, malloc-aligned). Like Go's own
// allocator, it panics when memory is exhausted: these are a few hundred bytes.
func (a *cArena) alloc(n uintptr) unsafe.Pointer {
	if n == 0 {
		n = 1
	}
	p := C.calloc(1, C.size_t(n))
	if p == nil {
		panic("shardadam: out of C memory for a call's arguments")
	}
	*a = append(*a, p)
	return p
}

// int64s copies values into C memory; nil for an empty slice.
func (a *cArena) int64s(values []int64) *C.int64_t {
	if len(values) == 0 {
		return nil
	}
	p := a.alloc(uintptr(len(values)) * 8)
	copy(unsafe.Slice((*int64)(p), len(values)), values)
	return (*C.int64_t)(p)
}

// str is s as a C string in the arena.
func (a *cArena) str(s string) *C.char {
	p := a.alloc(uintptr(len(s)) + 1)
	copy(unsafe.Slice((*byte)(p), len(s)), s)
	return (*C.char)(p)
}

func (a *cArena) free() {
	for _, p := range *a {
		C.free(p)
	}
	*a = nil
}

// handleless runs a call whose failure message is thread-local (sa_last_error) and
// returns its error, read on the thread that made the call.
func handleless(call func() C.sa_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if status := call(); status != C.SA_OK {
		return &Error{Status: Status(status), Message: C.GoString(C.sa_last_error())}
	}
	return nil
}

// check turns the status of a call on o into an error carrying the handle's message. The
// caller holds o's lock, so no other call has replaced the message.
func (o *Optimizer) check(status C.sa_status) error {
	if status == C.SA_OK {
		return nil
	}
	return &Error{Status: Status(status), Message: C.GoString(C.sa_optimizer_last_error(o.handle))}
}

// setAddress stores a that is not Go memory (a device address, a stream, C memory) in a
// pointer field of a C struct, as an integer, so it never passes through an
// unsafe.Pointer that the Go collector could mistake for one of its own.
func setAddress(field unsafe.Pointer, a uintptr) { *(*uintptr)(field) = a }
