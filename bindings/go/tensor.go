package shardadam

// #include <stdlib.h>
// #include <shardadam/shardadam.h>
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// DeviceKind is where memory lives (DLPack's DLDeviceType).
type DeviceKind int

// The memory kinds the library takes.
const (
	KindCPU  DeviceKind = C.kDLCPU  // host memory
	KindCUDA DeviceKind = C.kDLCUDA // CUDA device memory (the library's CUDA backend)
)

// Device is a memory's kind and, for CUDA, the device ordinal.
type Device struct {
	Kind DeviceKind // KindCPU or KindCUDA
	ID   int        // the CUDA device ordinal (0 for the CPU)
}

// CPU is host memory.
func CPU() Device { return Device{Kind: KindCPU} }

// CUDA is the memory of CUDA device id.
func CUDA(id int) Device { return Device{Kind: KindCUDA, ID: id} }

// String names the device as "cpu" or "cuda:<id>".
func (d Device) String() string {
	switch d.Kind {
	case KindCPU:
		return "cpu"
	case KindCUDA:
		return fmt.Sprintf("cuda:%d", d.ID)
	}
	return fmt.Sprintf("device(kind %d, id %d)", int(d.Kind), d.ID)
}

// Tensor describes a C-contiguous tensor in memory that Go does not manage: CUDA device
// memory (cudaMalloc), or host memory from C (malloc, cudaMallocHost pinned memory, a
// HostTensor). Never the address of Go memory (a slice's first element): the library keeps
// the address beyond the call, which the cgo rules forbid for Go memory, and the collector
// may move or free it.
//
// Whoever passes a Tensor to AddParamTensor or BindGrad keeps its memory allocated, of
// DType and Shape, until the optimizer is closed (a param) or the grad is rebound or
// cleared: the library checks dtype, shape and device at the call but cannot see the
// extent of raw memory.
type Tensor struct {
	Data   uintptr // address of the first element
	Device Device  // where Data is: CPU() or CUDA(id)
	DType  DType   // the library's name of the element type
	Shape  []int64 // row-major (C-contiguous) dims
}

// fill writes t into a C DLTensor whose shape array is shape (ndim entries of C memory).
func (t *Tensor) fill(dl *C.DLTensor, shape *C.int64_t) {
	setAddress(unsafe.Pointer(&dl.data), t.Data)
	dl.device = C.DLDevice{device_type: C.DLDeviceType(t.Device.Kind), device_id: C.int32_t(t.Device.ID)}
	dl.ndim = C.int32_t(len(t.Shape))
	dl.dtype = t.DType.dlpackType()
	if len(t.Shape) > 0 {
		copy(unsafe.Slice((*int64)(unsafe.Pointer(shape)), len(t.Shape)), t.Shape)
		dl.shape = shape
	}
	dl.strides = nil // C-contiguous
}

// cTensor is t as a DLTensor in C memory, borrowed by one call.
func (t *Tensor) cTensor(op string, mem *cArena) (*C.DLTensor, error) {
	if t.DType == DTypeDefault {
		return nil, bindingError(StatusInvalidArgument, "%s: the tensor has no dtype (Tensor.DType)", op)
	}
	if err := checkDTypes(op, t.DType); err != nil {
		return nil, err
	}
	dl := (*C.DLTensor)(mem.alloc(C.sizeof_DLTensor))
	t.fill(dl, (*C.int64_t)(mem.alloc(uintptr(len(t.Shape))*8)))
	return dl, nil
}

// HostTensor is a tensor in host memory allocated by C, so the library may keep its
// address (a param's data, a bound grad) while Go reads and writes it through
// Float32 or Bits16. Free it with Free once no optimizer uses it.
type HostTensor struct {
	mu    sync.Mutex
	data  unsafe.Pointer // nil once freed
	dtype DType
	shape []int64
	numel int64
	view  bool // memory of an optimizer's (HostGrad): Free leaves it alone
}

// NewHostTensor allocates a zeroed host tensor of the library's dtype dtype and shape.
func NewHostTensor(dtype DType, shape []int64) (*HostTensor, error) {
	const op = "shardadam.NewHostTensor"
	if dtype == DTypeDefault {
		return nil, bindingError(StatusInvalidArgument, "%s: a host tensor needs a dtype", op)
	}
	if err := checkDTypes(op, dtype); err != nil {
		return nil, err
	}
	numel, err := numelOf(op, "(host tensor)", shape)
	if err != nil {
		return nil, err
	}
	data := cAlloc(numel * dtype.size())
	if data == nil {
		return nil, bindingError(StatusOutOfMemory, "%s: cannot allocate %d bytes for %s %v", op, numel*dtype.size(), dtype, shape)
	}
	return &HostTensor{data: data, dtype: dtype, shape: append([]int64(nil), shape...), numel: numel}, nil
}

// cAlloc returns n zeroed bytes of C memory (malloc-aligned, so aligned for every dtype;
// one byte when n is 0, so that an empty tensor has an address), or nil.
func cAlloc(n int64) unsafe.Pointer {
	if n < 1 {
		n = 1
	}
	return C.calloc(1, C.size_t(n))
}

// Tensor describes the host tensor for AddParamTensor or BindGrad (zero value once freed).
func (h *HostTensor) Tensor() Tensor {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.data == nil {
		return Tensor{}
	}
	return Tensor{Data: uintptr(h.data), Device: CPU(), DType: h.dtype, Shape: append([]int64(nil), h.shape...)}
}

// Float32 views a float32 host tensor's memory (nil for another dtype or once freed).
// The view is valid until Free.
func (h *HostTensor) Float32() []float32 {
	if h.dtype != Float32 || h.data == nil {
		return nil
	}
	return unsafe.Slice((*float32)(h.data), h.numel)
}

// Bits16 views the raw bits of a bfloat16 or float16 host tensor (nil otherwise), as
// Float32 does.
func (h *HostTensor) Bits16() []uint16 {
	if (h.dtype != BFloat16 && h.dtype != Float16) || h.data == nil {
		return nil
	}
	return unsafe.Slice((*uint16)(h.data), h.numel)
}

// Bytes views the raw bytes of a host tensor of any dtype (nil once freed), as Float32
// does: an fp8 tensor's codes, say.
func (h *HostTensor) Bytes() []byte {
	if h.data == nil {
		return nil
	}
	return unsafe.Slice((*byte)(h.data), h.numel*h.dtype.size())
}

// Free releases the memory. Close the optimizers that hold it (as a param) or rebind
// their grads first: the library would go on using the address. Freeing twice is a no-op,
// and so is freeing a HostGrad buffer, which its optimizer frees.
func (h *HostTensor) Free() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.view {
		C.free(h.data)
	}
	h.data = nil
}
