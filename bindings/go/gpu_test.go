package shardadam

import (
	"testing"

	"github.com/shardadam/shardadam/bindings/go/internal/cudart"
)

// The GPU test: params and grads in CUDA device memory (cudaMalloc through
// internal/cudart, which opens libcudart at run time, so this file builds and skips
// everywhere else), steps on a stream of the test's. It skips, saying why, without a
// CUDA runtime, a device, or a library built with its CUDA backend.

// cudaMemory is callerMemory in device memory of device 0, with one stream.
type cudaMemory struct{ s uintptr }

func (cudaMemory) device() Device { return CUDA(0) }
func (cudaMemory) alloc(t *testing.T, dtype DType, shape []int64) Tensor {
	t.Helper()
	p, err := cudart.Malloc(int(product(shape) * dtype.size()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cudart.Free(p) })
	return Tensor{Data: p, Device: CUDA(0), DType: dtype, Shape: shape}
}
func (cudaMemory) upload(t *testing.T, dst Tensor, src []float32) {
	t.Helper()
	// cudaMemcpy from pageable memory runs on the legacy default stream, which a step on a
	// created (blocking) stream waits for.
	if err := cudart.ToDevice(dst.Data, src); err != nil {
		t.Fatal(err)
	}
}
func (cudaMemory) download(t *testing.T, dst []float32, src Tensor) {
	t.Helper()
	if err := cudart.ToHost(dst, src.Data); err != nil {
		t.Fatal(err)
	}
}
func (m cudaMemory) stream() uintptr { return m.s }
func (m cudaMemory) sync(t *testing.T) {
	t.Helper()
	if err := cudart.StreamSynchronize(m.s); err != nil {
		t.Fatal(err)
	}
}

// requireGPU skips the test, with the reason, unless a CUDA device can be used.
func requireGPU(t *testing.T) cudaMemory {
	t.Helper()
	runtime, err := cudart.Load()
	if err != nil {
		t.Skipf("SKIP: no CUDA GPU: %v", err)
	}
	t.Logf("%s; %s", runtime, BuildInfo())
	s, err := cudart.StreamCreate()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cudart.StreamDestroy(s) })
	return cudaMemory{s: s}
}

// 300 steps of the linear fit with params and grads in device memory, grads bound once
// and stepped on the test's stream: the params follow the float64 reference, the loss
// falls, and they equal the CPU backend's bit for bit (one update formula for both
// backends, kernels/adam_math.h).
func TestGPUTrainingOnDeviceMemoryFollowsTheReferenceAndTheCPUBackend(t *testing.T) {
	gpu := requireGPU(t)
	w, b := trainOnCallerMemory(t, gpu, 300)
	cw, cb := trainOnCallerMemory(t, hostMemory{}, 300)
	if diff := bitsEqual(w, cw); diff != "" {
		t.Errorf("linear.w: GPU and CPU backends differ at %s", diff)
	}
	if diff := bitsEqual(b, cb); diff != "" {
		t.Errorf("linear.b: GPU and CPU backends differ at %s", diff)
	}
}

// A CUDA optimizer refuses host grads and host-side loss scales with messages that say
// what to do instead.
func TestGPUOptimizerRefusesHostGradsWithTheLibrarysMessage(t *testing.T) {
	gpu := requireGPU(t)
	opt := newOptimizer(t)
	defer opt.Close() // before the test's cleanups free the memory it holds
	mustAddGroup(t, opt, nil)
	data := gpu.alloc(t, Float32, []int64{4})
	gpu.upload(t, data, []float32{1, 2, 3, 4})
	p, err := opt.AddParamTensor("gpu.w", 0, data, nil)
	if err != nil {
		if e := asError(t, err); e.Status == StatusUnsupported {
			t.Skipf("SKIP: the library cannot take CUDA memory: %s", e.Message)
		}
		t.Fatalf("AddParamTensor: %v", err)
	}
	host := hostMemory{}.alloc(t, Float32, []int64{4})
	expectError(t, "BindGrad(host grad for a CUDA param)", logged(t, opt.BindGrad(p, host)), StatusMismatch,
		"sa_optimizer_set_grad", "param 'gpu.w'", "cpu", "cuda:0")
	_, err = opt.HostGrad(p)
	expectError(t, "HostGrad(CUDA param)", logged(t, err), StatusMismatch, "gpu.w", "BindGrad")
	grad := gpu.alloc(t, Float32, []int64{4})
	if err := opt.BindGrad(p, grad); err != nil {
		t.Fatalf("BindGrad: %v", err)
	}
	_, err = opt.StepWith(StepArgs{InvGradScale: 0.5, Stream: gpu.stream()})
	expectError(t, "StepWith(host InvGradScale on CUDA)", logged(t, err), StatusInvalidArgument, "InvGradScaleAt")
}

// On the GPU: the inverse loss scale and the found-inf flag in device memory, read when
// the stream reaches the step, grads clipped by their norm, a skipped step.
func TestGPULossScaleAndFoundInfInDeviceMemoryAndClipping(t *testing.T) {
	clipAndSkipOnCallerMemory(t, requireGPU(t))
}
