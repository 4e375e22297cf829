// Package cudart is the little of the CUDA runtime that the Go tests and the GPU example
// need to put params and grads in device memory: libcudart is opened at run time
// (dlopen), so the package builds and its users run on machines without CUDA, where Load
// says why there is no GPU. A program of your own would link the runtime it already uses.
//
// Device addresses and streams cross as uintptr (they are never Go memory); copies are
// synchronous (cudaMemcpy), so Go memory is read or written during the call only.
package cudart

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

// The entry points used, by their CUDA runtime names and signatures (cudaError_t is an
// int enum; cudaStream_t a pointer).
static int (*p_cudaGetDeviceCount)(int*);
static int (*p_cudaSetDevice)(int);
static int (*p_cudaMalloc)(void**, size_t);
static int (*p_cudaFree)(void*);
static int (*p_cudaMemcpy)(void*, const void*, size_t, int);
static int (*p_cudaStreamCreate)(void**);
static int (*p_cudaStreamSynchronize)(void*);
static int (*p_cudaStreamDestroy)(void*);
static int (*p_cudaRuntimeGetVersion)(int*);
static const char* (*p_cudaGetErrorString)(int);

// Opens the runtime `name` and finds every entry point: NULL, or why not.
static const char* cudart_open(const char* name) {
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) return dlerror();
#define CUDART_SYM(f) \
  if ((*(void**)&p_##f = dlsym(lib, #f)) == NULL) return "libcudart lacks " #f;
  CUDART_SYM(cudaGetDeviceCount) CUDART_SYM(cudaSetDevice) CUDART_SYM(cudaMalloc)
  CUDART_SYM(cudaFree) CUDART_SYM(cudaMemcpy) CUDART_SYM(cudaStreamCreate)
  CUDART_SYM(cudaStreamSynchronize) CUDART_SYM(cudaStreamDestroy)
  CUDART_SYM(cudaRuntimeGetVersion) CUDART_SYM(cudaGetErrorString)
#undef CUDART_SYM
  return NULL;
}

// Go cannot call C function pointers: one wrapper per entry point.
static int cudart_device_count(int* n) { return p_cudaGetDeviceCount(n); }
static int cudart_set_device(int d) { return p_cudaSetDevice(d); }
static int cudart_runtime_version(int* v) { return p_cudaRuntimeGetVersion(v); }
static int cudart_malloc(uintptr_t* out, size_t n) {
  void* p = NULL;
  int rc = p_cudaMalloc(&p, n);
  *out = (uintptr_t)p;
  return rc;
}
static int cudart_free(uintptr_t p) { return p_cudaFree((void*)p); }
static int cudart_to_device(uintptr_t dst, const void* src, size_t n) {
  return p_cudaMemcpy((void*)dst, src, n, 1); // cudaMemcpyHostToDevice
}
static int cudart_to_host(void* dst, uintptr_t src, size_t n) {
  return p_cudaMemcpy(dst, (const void*)src, n, 2); // cudaMemcpyDeviceToHost
}
static int cudart_stream_create(uintptr_t* out) {
  void* s = NULL;
  int rc = p_cudaStreamCreate(&s);
  *out = (uintptr_t)s;
  return rc;
}
static int cudart_stream_synchronize(uintptr_t s) { return p_cudaStreamSynchronize((void*)s); }
static int cudart_stream_destroy(uintptr_t s) { return p_cudaStreamDestroy((void*)s); }
static const char* cudart_error_string(int rc) { return p_cudaGetErrorString(rc); }
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"
)

var lib struct {
	once sync.Once
	name string // the library that was opened
	err  error
}

// libraries are tried in this order; $SHARDADAM_CUDART, when set, is tried alone.
var libraries = []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12"}

// Load opens the CUDA runtime and checks that it sees a device; the error says why not
// (no libcudart on the loader's path, no driver, no device), for a test's Skip. It
// returns the library's name and runtime version on success.
func Load() (string, error) {
	lib.once.Do(func() {
		names := libraries
		if env := os.Getenv("SHARDADAM_CUDART"); env != "" {
			names = []string{env}
		}
		var why []string
		for _, name := range names {
			cname := C.CString(name)
			msg := C.cudart_open(cname)
			C.free(unsafe.Pointer(cname))
			if msg == nil {
				lib.name = name
				break
			}
			why = append(why, C.GoString(msg))
		}
		if lib.name == "" {
			lib.err = fmt.Errorf("cannot open the CUDA runtime (%s; set LD_LIBRARY_PATH or SHARDADAM_CUDART)", strings.Join(why, "; "))
			return
		}
		var n C.int
		if err := check("cudaGetDeviceCount", C.cudart_device_count(&n)); err != nil {
			lib.err = fmt.Errorf("%s: %w", lib.name, err)
		} else if n == 0 {
			lib.err = fmt.Errorf("%s sees no CUDA device", lib.name)
		}
	})
	if lib.err != nil {
		return "", lib.err
	}
	var version C.int
	C.cudart_runtime_version(&version)
	return fmt.Sprintf("%s (CUDA runtime %d.%d)", lib.name, version/1000, version%1000/10), nil
}

func check(what string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return fmt.Errorf("%s: CUDA error %d: %s", what, int(rc), C.GoString(C.cudart_error_string(rc)))
}

// SetDevice makes device the calling thread's current device (cudaSetDevice). Go moves
// goroutines between threads: callers that use a device other than 0 lock the goroutine
// to its thread (runtime.LockOSThread) first.
func SetDevice(device int) error { return check("cudaSetDevice", C.cudart_set_device(C.int(device))) }

// Malloc allocates n bytes of device memory (cudaMalloc) and returns their address.
func Malloc(n int) (uintptr, error) {
	var p C.uintptr_t
	err := check(fmt.Sprintf("cudaMalloc(%d)", n), C.cudart_malloc(&p, C.size_t(n)))
	return uintptr(p), err
}

// Free releases device memory from Malloc (cudaFree).
func Free(p uintptr) error { return check("cudaFree", C.cudart_free(C.uintptr_t(p))) }

// ToDevice copies src to the device memory at dst (cudaMemcpy, synchronous).
func ToDevice[T any](dst uintptr, src []T) error {
	if len(src) == 0 {
		return nil
	}
	n := C.size_t(len(src)) * C.size_t(unsafe.Sizeof(src[0]))
	return check("cudaMemcpy to the device", C.cudart_to_device(C.uintptr_t(dst), unsafe.Pointer(&src[0]), n))
}

// ToHost copies the device memory at src into dst (cudaMemcpy, synchronous).
func ToHost[T any](dst []T, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	n := C.size_t(len(dst)) * C.size_t(unsafe.Sizeof(dst[0]))
	return check("cudaMemcpy to the host", C.cudart_to_host(unsafe.Pointer(&dst[0]), C.uintptr_t(src), n))
}

// StreamCreate creates a stream (cudaStreamCreate) and returns its cudaStream_t.
func StreamCreate() (uintptr, error) {
	var s C.uintptr_t
	err := check("cudaStreamCreate", C.cudart_stream_create(&s))
	return uintptr(s), err
}

// StreamSynchronize waits until the stream has done all its work.
func StreamSynchronize(s uintptr) error {
	return check("cudaStreamSynchronize", C.cudart_stream_synchronize(C.uintptr_t(s)))
}

// StreamDestroy destroys a stream from StreamCreate.
func StreamDestroy(s uintptr) error {
	return check("cudaStreamDestroy", C.cudart_stream_destroy(C.uintptr_t(s)))
}
