// Command gpu takes a first step on the GPU from Go: a [6, 4] weight in CUDA device
// memory, fitted to a target with AdamW; its grad buffer, also in device memory, is bound
// once, and every step is enqueued on a stream of the program's. docs/go.md walks through
// it. Without a CUDA GPU, or with a library built without CUDA, it says so and exits 0.
//
// The CUDA runtime calls (cudaMalloc, cudaMemcpy, streams) go through internal/cudart,
// which opens libcudart at run time so that this example builds everywhere; a program of
// your own uses the CUDA runtime it already links, and hands its addresses over as
// uintptr.
//
// Run it from bindings/go, with the library found by pkg-config (see the package doc):
//
//	PKG_CONFIG_PATH=<prefix>/lib/pkgconfig LD_LIBRARY_PATH=<prefix>/lib go run ./example/gpu
package main

import (
	"errors"
	"fmt"
	"log"
	"math/rand"

	shardadam "github.com/shardadam/shardadam/bindings/go"
	"github.com/shardadam/shardadam/bindings/go/internal/cudart"
)

func main() {
	fmt.Println(shardadam.BuildInfo())
	runtime, err := cudart.Load()
	if err != nil {
		fmt.Printf("SKIPPED: no CUDA GPU: %v\n", err)
		return
	}
	fmt.Println(runtime)

	shape := []int64{6, 4}
	numel := int(shape[0] * shape[1])
	rng := rand.New(rand.NewSource(1))
	target := make([]float32, numel)
	for i := range target {
		target[i] = float32(rng.NormFloat64())
	}

	// Device memory for the weight and its grad. The optimizer keeps both addresses, so
	// they stay allocated until it is closed (the deferred Close runs before these Frees).
	weight, grad := mustMalloc(numel*4), mustMalloc(numel*4)
	defer cudart.Free(weight)
	defer cudart.Free(grad)
	must(cudart.ToDevice(weight, make([]float32, numel))) // start from zeros
	stream, err := cudart.StreamCreate()
	must(err)
	defer cudart.StreamDestroy(stream)

	opt, err := shardadam.NewOptimizer(nil)
	must(err)
	defer opt.Close()
	_, err = opt.AddGroup(shardadam.GroupConfig{"lr": 0.1, "weight_decay": 0})
	must(err)
	onDevice := func(address uintptr) shardadam.Tensor {
		return shardadam.Tensor{Data: address, Device: shardadam.CUDA(0), DType: shardadam.Float32, Shape: shape}
	}
	w, err := opt.AddParamTensor("fit.w", 0, onDevice(weight), nil)
	var e *shardadam.Error
	if errors.As(err, &e) && e.Status == shardadam.StatusUnsupported {
		fmt.Printf("SKIPPED: this library has no CUDA backend: %s\n", e.Message)
		return
	}
	must(err)
	// Bound once, zero-copy: every step reads the grad where it is.
	must(opt.BindGrad(w, onDevice(grad)))

	values, hostGrad := make([]float32, numel), make([]float32, numel)
	firstLoss, loss := 0.0, 0.0
	for step := 1; step <= 100; step++ {
		// loss = 1/2 |w - target|^2, so grad = w - target. A real engine's backward pass
		// writes the grad into the bound buffer on the device; here the host computes it.
		must(cudart.ToHost(values, weight))
		loss = 0
		for i := range values {
			hostGrad[i] = values[i] - target[i]
			loss += 0.5 * float64(hostGrad[i]*hostGrad[i])
		}
		must(cudart.ToDevice(grad, hostGrad))
		// Enqueued on the stream; the host does not wait.
		_, err := opt.StepWith(shardadam.StepArgs{Stream: stream})
		must(err)
		// Wait for the step before reading the weight back.
		must(cudart.StreamSynchronize(stream))
		if step == 1 {
			firstLoss = loss
		}
		if step == 1 || step%25 == 0 {
			fmt.Printf("step %3d  loss %.5f\n", step, loss)
		}
	}
	if loss > 0.01*firstLoss {
		log.Fatalf("the loss fell only from %.5f to %.5f", firstLoss, loss)
	}
	n, err := opt.StepCount(0)
	must(err)
	fmt.Printf("%d steps on %s, loss %.5f -> %.5f\n", n, w.Device, firstLoss, loss)
}

func mustMalloc(bytes int) uintptr {
	p, err := cudart.Malloc(bytes)
	must(err)
	return p
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
