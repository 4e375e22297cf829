package shardadam

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

// A small model trained for a few hundred steps on memory the caller owns: params and
// grads are Tensors the optimizer keeps (AddParamTensor, BindGrads once), the loop only
// copies fresh grads into the bound grad memory before each step. Run on host memory
// here and on CUDA memory by the GPU test (gpu_test.go), against the float64 reference
// fed the same grads.

// callerMemory is where the trainer's tensors live.
type callerMemory interface {
	device() Device
	alloc(t *testing.T, dtype DType, shape []int64) Tensor // freed at the test's end
	upload(t *testing.T, dst Tensor, src []float32)
	download(t *testing.T, dst []float32, src Tensor)
	stream() uintptr // the step's stream
	sync(t *testing.T)
}

// hostMemory is callerMemory of C host tensors.
type hostMemory struct{}

func (hostMemory) device() Device { return CPU() }
func (hostMemory) alloc(t *testing.T, dtype DType, shape []int64) Tensor {
	t.Helper()
	h, err := NewHostTensor(dtype, shape)
	if err != nil {
		t.Fatalf("NewHostTensor(%s, %v): %v", dtype, shape, err)
	}
	t.Cleanup(h.Free)
	return h.Tensor()
}
func (hostMemory) upload(t *testing.T, dst Tensor, src []float32) {
	copy(unsafeFloat32s(dst), src)
}
func (hostMemory) download(t *testing.T, dst []float32, src Tensor) {
	copy(dst, unsafeFloat32s(src))
}
func (hostMemory) stream() uintptr   { return 0 }
func (hostMemory) sync(t *testing.T) {}

// unsafeFloat32s views a float32 host Tensor.
func unsafeFloat32s(t Tensor) []float32 {
	return (&Param{DType: Float32, host: pointerAt(t.Data), numel: product(t.Shape)}).Float32()
}

// linearFit is y = x w + b fitted to targets made by a hidden w and b: loss
// 1/(2n) |x w + b - y|^2 over n samples.
type linearFit struct {
	n, in, out int
	x, y       []float64
}

func newLinearFit(rng *rand.Rand, n, in, out int) *linearFit {
	f := &linearFit{n: n, in: in, out: out, x: make([]float64, n*in), y: make([]float64, n*out)}
	for i := range f.x {
		f.x[i] = rng.NormFloat64()
	}
	w, b := make([]float64, in*out), make([]float64, out)
	for i := range w {
		w[i] = rng.NormFloat64()
	}
	for i := range b {
		b[i] = rng.NormFloat64()
	}
	for s := 0; s < n; s++ {
		for o := 0; o < out; o++ {
			v := b[o]
			for i := 0; i < in; i++ {
				v += f.x[s*in+i] * w[i*out+o]
			}
			f.y[s*out+o] = v
		}
	}
	return f
}

// lossAndGrads returns the loss at (w, b) and its grads, rounded to float32.
func (f *linearFit) lossAndGrads(w, b []float32) (loss float64, gw, gb []float32) {
	dw, db := make([]float64, len(w)), make([]float64, len(b))
	for s := 0; s < f.n; s++ {
		for o := 0; o < f.out; o++ {
			r := float64(b[o]) - f.y[s*f.out+o]
			for i := 0; i < f.in; i++ {
				r += f.x[s*f.in+i] * float64(w[i*f.out+o])
			}
			loss += 0.5 * r * r / float64(f.n)
			db[o] += r / float64(f.n)
			for i := 0; i < f.in; i++ {
				dw[i*f.out+o] += f.x[s*f.in+i] * r / float64(f.n)
			}
		}
	}
	gw, gb = make([]float32, len(w)), make([]float32, len(b))
	for i := range dw {
		gw[i] = float32(dw[i])
	}
	for i := range db {
		gb[i] = float32(db[i])
	}
	return loss, gw, gb
}

// trainOnCallerMemory trains the fit for steps steps on mem and checks, at every step,
// the params against the float64 reference (within the drift float32 rounding of
// params and moments accumulates: 1e-4 relative), and that the loss falls below 1% of
// its start. It returns the final params.
func trainOnCallerMemory(t *testing.T, mem callerMemory, steps int) (w, b []float32) {
	t.Helper()
	rng := rand.New(rand.NewSource(97))
	fit := newLinearFit(rng, 64, 8, 4)
	opt := newOptimizer(t)
	defer opt.Close() // before the test's cleanups free the memory it holds
	hp := DefaultGroupConfig()
	hp["lr"] = 3e-2
	mustAddGroup(t, opt, hp)

	shapes := [][]int64{{int64(fit.in), int64(fit.out)}, {int64(fit.out)}}
	names := []string{"linear.w", "linear.b"}
	values := [][]float32{randomValues(rng, shapes[0][0]*shapes[0][1]), randomValues(rng, shapes[1][0])}
	refs := []*refState{newRefState(values[0]), newRefState(values[1])}
	params := make([]*Param, 2)
	grads := make([]*Tensor, 2)
	for i := range params {
		data := mem.alloc(t, Float32, shapes[i])
		mem.upload(t, data, values[i])
		p, err := opt.AddParamTensor(names[i], 0, data, nil)
		if err != nil {
			if e := asError(t, err); e.Status == StatusUnsupported && mem.device().Kind == KindCUDA {
				t.Skipf("SKIP: the library cannot take CUDA memory: %s", e.Message)
			}
			t.Fatalf("AddParamTensor(%s): %v", names[i], err)
		}
		params[i] = p
		g := mem.alloc(t, Float32, shapes[i])
		grads[i] = &g
	}
	if err := opt.BindGrads(grads); err != nil { // once: every step reads them in place
		t.Fatalf("BindGrads: %v", err)
	}

	var first, loss, worst float64 // worst: the largest diff / allowed diff seen
	for step := 1; step <= steps; step++ {
		var gw, gb []float32
		loss, gw, gb = fit.lossAndGrads(values[0], values[1])
		if step == 1 {
			first = loss
		}
		mem.upload(t, *grads[0], gw)
		mem.upload(t, *grads[1], gb)
		if _, err := opt.StepWith(StepArgs{Stream: mem.stream()}); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		refs[0].step(gw, hp, step, 1)
		refs[1].step(gb, hp, step, 1)
		mem.sync(t) // the step has run: the params hold its result
		for i, p := range params {
			mem.download(t, values[i], p.Tensor())
			for j, want := range refs[i].p {
				diff, allowed := math.Abs(float64(values[i][j])-want), 1e-5+1e-4*math.Abs(want)
				worst = math.Max(worst, diff/allowed)
				if diff > allowed {
					t.Fatalf("step %d: %s[%d] = %.9g, float64 reference %.9g (diff %.3g)", step, p.Name, j, values[i][j], want, diff)
				}
			}
		}
		if step == 1 || step%100 == 0 {
			t.Logf("%s: step %3d  loss %.6f", mem.device(), step, loss)
		}
	}
	t.Logf("%s: the largest diff from the reference was %.2f of the tolerance", mem.device(), worst)
	if loss > 0.01*first {
		t.Errorf("%s: the loss fell only from %.6f to %.6f in %d steps", mem.device(), first, loss, steps)
	}
	if n, err := opt.StepCount(0); err != nil || n != int64(steps) {
		t.Errorf("StepCount = %d, %v; want %d", n, err, steps)
	}
	return values[0], values[1]
}

// On host memory the caller owns, 300 steps follow the reference and the loss falls.
func TestTrainingOnCallerHostMemoryFollowsTheReferenceAndTheLossFalls(t *testing.T) {
	trainOnCallerMemory(t, hostMemory{}, 300)
}

// bitsEqual reports the first index where a and b differ bit for bit, or -1.
func bitsEqual(a, b []float32) string {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return fmt.Sprintf("[%d]: %v vs %v", i, a[i], b[i])
		}
	}
	return ""
}

// clipAndSkipOnCallerMemory runs six steps of one param on mem with its grad bound once,
// the inverse loss scale and the found-inf flag read from mem by address (InvGradScaleAt,
// FoundInfAt) and the grads clipped to norm 1: each step's reported norm is the float64
// norm of the scaled grads, step 3 (flag set) is skipped and changes nothing, and the
// param follows the reference fed the scaled, clipped grads.
func clipAndSkipOnCallerMemory(t *testing.T, mem callerMemory) {
	t.Helper()
	rng := rand.New(rand.NewSource(101))
	opt := newOptimizer(t)
	defer opt.Close() // before the test's cleanups free the memory it holds
	hp := DefaultGroupConfig()
	hp["lr"] = 1e-2
	mustAddGroup(t, opt, hp)
	shape := []int64{257} // odd: a partial SIMD tail and a partial block
	values := randomValues(rng, shape[0])
	ref := newRefState(values)
	data := mem.alloc(t, Float32, shape)
	mem.upload(t, data, values)
	p, err := opt.AddParamTensor("clip.w", 0, data, nil)
	if err != nil {
		if e := asError(t, err); e.Status == StatusUnsupported && mem.device().Kind == KindCUDA {
			t.Skipf("SKIP: the library cannot take CUDA memory: %s", e.Message)
		}
		t.Fatalf("AddParamTensor: %v", err)
	}
	grad, scale, flag := mem.alloc(t, Float32, shape), mem.alloc(t, Float32, []int64{1}), mem.alloc(t, Float32, []int64{1})
	if err := opt.BindGrad(p, grad); err != nil {
		t.Fatalf("BindGrad: %v", err)
	}
	const invScale, bound = 0.5, 1.0
	mem.upload(t, scale, []float32{invScale})
	count := 0
	for step := 1; step <= 6; step++ {
		g := randomValues(rng, shape[0])
		for i := range g {
			g[i] *= 4 // a norm of about 32 after the scale: well above the bound
		}
		mem.upload(t, grad, g)
		skip := step == 3
		mem.upload(t, flag, []float32{map[bool]float32{false: 0, true: 1}[skip]})
		report, err := opt.StepWith(StepArgs{Stream: mem.stream(), InvGradScaleAt: scale.Data,
			FoundInfAt: flag.Data, MaxGradNorm: bound})
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if report.Skipped != skip {
			t.Fatalf("step %d: Skipped = %v, want %v", step, report.Skipped, skip)
		}
		if !skip {
			norm := 0.0
			for _, x := range g {
				norm += float64(x) * invScale * float64(x) * invScale
			}
			norm = math.Sqrt(norm)
			if math.Abs(report.GradNorm-norm) > 1e-6*norm {
				t.Fatalf("step %d: GradNorm = %.9g, float64 norm %.9g", step, report.GradNorm, norm)
			}
			count++
			ref.step(g, hp, count, invScale*math.Min(1, bound/(norm+1e-6)))
		}
		mem.sync(t)
		mem.download(t, values, p.Tensor())
		expectClose(t, fmt.Sprintf("%s: step %d", mem.device(), step), values, ref.p)
	}
	if n, err := opt.StepCount(0); err != nil || n != 5 {
		t.Errorf("StepCount = %d, %v; want 5 (one of six skipped)", n, err)
	}
}

// On host memory: the scale and the flag by address, clipping, a skipped step.
func TestLossScaleAndFoundInfByAddressAndClippingOnCallerHostMemory(t *testing.T) {
	clipAndSkipOnCallerMemory(t, hostMemory{})
}
