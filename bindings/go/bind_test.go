package shardadam

import (
	"fmt"
	"math/rand"
	"reflect"
	"testing"
)

// Grads bound once, zero-copy: the library reads the bound buffers in place at every
// step, so a loop that only writes new grads into them follows the float64 reference.
// Covers the optimizer's own buffer (HostGrad), a C host tensor of the caller's bound by
// BindGrads, and a param whose data is a host tensor of the caller's (AddParamTensor).

// A model of three params, each with its grad buffer bound once before the first step;
// eight steps write fresh grads into the buffers (never rebinding) and match the
// reference at every step.
func TestHostGradBuffersBoundOnceFollowTheReferenceWithoutRebinding(t *testing.T) {
	rng := rand.New(rand.NewSource(41))
	opt := newOptimizer(t)
	defer opt.Close() // before the test's cleanups free the memory it holds
	hp := DefaultGroupConfig()
	hp["lr"] = 2e-2
	mustAddGroup(t, opt, hp)

	w, err := opt.AddParam("w", 0, []int64{6, 5}, randomValues(rng, 30), nil)
	if err != nil {
		t.Fatalf("AddParam(w): %v", err)
	}
	// A param whose memory is the caller's: a C host tensor.
	biasData, err := NewHostTensor(Float32, []int64{5})
	if err != nil {
		t.Fatalf("NewHostTensor: %v", err)
	}
	t.Cleanup(biasData.Free)
	copy(biasData.Float32(), randomValues(rng, 5))
	bias, err := opt.AddParamTensor("bias", 0, biasData.Tensor(), nil)
	if err != nil {
		t.Fatalf("AddParamTensor(bias): %v", err)
	}
	odd, err := opt.AddParam("odd", 0, []int64{1, 3, 1}, randomValues(rng, 3), nil)
	if err != nil {
		t.Fatalf("AddParam(odd): %v", err)
	}
	params := []*Param{w, bias, odd}
	refs := make([]*refState, len(params))
	for i, p := range params {
		refs[i] = newRefState(p.Float32())
	}

	// w: the optimizer's buffer; bias and odd: the caller's, bound together.
	wGrad, err := opt.HostGrad(w)
	if err != nil {
		t.Fatalf("HostGrad(w): %v", err)
	}
	var callerGrads []*HostTensor
	for _, p := range params[1:] {
		g, err := NewHostTensor(Float32, p.Shape)
		if err != nil {
			t.Fatalf("NewHostTensor(%v): %v", p.Shape, err)
		}
		t.Cleanup(g.Free)
		callerGrads = append(callerGrads, g)
	}
	bGrad, oddGrad := callerGrads[0].Tensor(), callerGrads[1].Tensor()
	if err := opt.BindGrads([]*Tensor{nil, &bGrad, &oddGrad}); err != nil {
		t.Fatalf("BindGrads: %v", err)
	}
	if err := opt.BindGrads([]*Tensor{nil, &bGrad, &oddGrad}); err != nil { // nil: w has no grad ...
		t.Fatalf("BindGrads again: %v", err)
	}
	if _, err := opt.HostGrad(w); err != nil { // ... until it is bound again
		t.Fatalf("HostGrad(w) again: %v", err)
	}
	buffers := [][]float32{wGrad.Float32(), callerGrads[0].Float32(), callerGrads[1].Float32()}

	for step := 1; step <= 8; step++ {
		for i, buf := range buffers {
			grad := randomValues(rng, int64(len(buf)))
			copy(buf, grad) // the only thing a step needs: new values in the bound memory
			refs[i].step(grad, hp, step, 1)
		}
		if err := opt.Step(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for i, p := range params {
			expectClose(t, fmt.Sprintf("step %d: %s", step, p.Name), p.Float32(), refs[i].p)
		}
	}
	expectClose(t, "bias (the caller's memory)", biasData.Float32(), refs[1].p)
	if got, err := opt.ParamSteps(0, 3); err != nil || !reflect.DeepEqual(got, []int64{8, 8, 8}) {
		t.Errorf("ParamSteps = %v, %v; want [8 8 8]", got, err)
	}
	for i, p := range params {
		m, err := opt.State(p, "exp_avg")
		if err != nil {
			t.Fatalf("State(%s, exp_avg): %v", p.Name, err)
		}
		expectClose(t, p.Name+"/exp_avg", m, refs[i].m)
	}
}

// The library checks every binding: a grad of the wrong dtype, shape or device is refused
// with its own message naming the param and what it expected, and the grad bound before
// stays bound (the next step uses it).
func TestBindGradRefusesWrongDTypeShapeOrDeviceWithTheLibrarysMessage(t *testing.T) {
	rng := rand.New(rand.NewSource(43))
	opt := newOptimizer(t)
	defer opt.Close() // before the test's cleanups free the memory it holds
	hp := DefaultGroupConfig()
	mustAddGroup(t, opt, hp)
	init := randomValues(rng, 12)
	w, err := opt.AddParam("layers.0.w", 0, []int64{3, 4}, init, nil)
	if err != nil {
		t.Fatalf("AddParam: %v", err)
	}
	good, err := NewHostTensor(Float32, []int64{3, 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(good.Free)
	grad := randomValues(rng, 12)
	copy(good.Float32(), grad)
	if err := opt.BindGrad(w, good.Tensor()); err != nil {
		t.Fatalf("BindGrad: %v", err)
	}

	bf16, err := NewHostTensor(BFloat16, []int64{3, 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bf16.Free)
	expectError(t, "BindGrad(bfloat16 grad)", logged(t, opt.BindGrad(w, bf16.Tensor())), StatusMismatch,
		"sa_optimizer_set_grad", "param 'layers.0.w'", "bfloat16", "float32")

	wrongShape := good.Tensor()
	wrongShape.Shape = []int64{4, 3}
	expectError(t, "BindGrad(shape [4 3])", logged(t, opt.BindGrad(w, wrongShape)), StatusMismatch,
		"sa_optimizer_set_grad", "param 'layers.0.w'", "[4, 3]", "[3, 4]")

	onGPU := good.Tensor()
	onGPU.Device = CUDA(0)
	expectError(t, "BindGrad(CUDA memory for a CPU optimizer)", logged(t, opt.BindGrad(w, onGPU)), StatusMismatch,
		"sa_optimizer_set_grad", "param 'layers.0.w'", "cuda")

	expectError(t, "BindGrads(one bad entry)", logged(t, opt.BindGrads([]*Tensor{&wrongShape})), StatusMismatch,
		"sa_optimizer_set_grads", "param 'layers.0.w'")
	expectError(t, "BindGrads(two entries for one param)", opt.BindGrads([]*Tensor{nil, nil}),
		StatusInvalidArgument, "n is 2 but the optimizer has 1 params")

	// Refused bindings left the first one in place.
	if err := opt.Step(); err != nil {
		t.Fatalf("Step: %v", err)
	}
	ref := newRefState(init)
	ref.step(grad, hp, 1, 1)
	expectClose(t, "after the refused bindings", w.Float32(), ref.p)

	// A tensor on the GPU is refused by a library without a CUDA backend, or by one
	// whose device does not match: either way with its reason, and nothing is added.
	dev := Tensor{Data: 1 << 20, Device: CUDA(0), DType: Float32, Shape: []int64{4}}
	_, err = opt.AddParamTensor("gpu.w", 0, dev, nil)
	expectError(t, "AddParamTensor(CUDA memory in a CPU optimizer)", logged(t, err), StatusMismatch, "gpu.w")
	if n := len(opt.params); n != 1 {
		t.Errorf("a refused AddParamTensor left %d params", n)
	}
}

// logged shows err in the test's log (go test -v): what a user of the binding reads.
func logged(t *testing.T, err error) error {
	t.Helper()
	t.Logf("%v", err)
	return err
}

// Once the grads are bound, a step copies nothing and its cost on the Go side does not
// grow with the number of params: the step arguments live in C memory allocated with the
// optimizer, and the library reads the bound grads in place. (cgo boxes the opaque
// handle for its pointer check at each call, a constant 8 bytes.)
func TestAStepWithBoundGradsAllocatesTheSameForOneParamOrMany(t *testing.T) {
	allocsPerStep := func(params int) float64 {
		opt := newOptimizer(t)
		mustAddGroup(t, opt, nil)
		for i := 0; i < params; i++ {
			p, err := opt.AddParam(fmt.Sprintf("layers.%d.w", i), 0, []int64{64}, make([]float32, 64), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := opt.HostGrad(p); err != nil {
				t.Fatal(err)
			}
		}
		if err := opt.Step(); err != nil { // the first step builds the launch plan
			t.Fatal(err)
		}
		return testing.AllocsPerRun(50, func() {
			if _, err := opt.StepWith(StepArgs{}); err != nil {
				t.Fatal(err)
			}
		})
	}
	one, many := allocsPerStep(1), allocsPerStep(100)
	t.Logf("Go allocations per step: %v with 1 param, %v with 100", one, many)
	if many != one || one > 1 {
		t.Errorf("Go allocations per step: %v with 1 param, %v with 100; want the same, at most 1", one, many)
	}
}
