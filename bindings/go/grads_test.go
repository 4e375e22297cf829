package shardadam

import (
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// Grad bindings and per-param step counts: every binding is checked by the library and
// all or nothing, a param without a grad is skipped bit for bit without advancing its
// count, per-param counts drive bias correction, and partial steps (StepParams) step their
// params only. References: refState (float64).

var trioNames = []string{"emb", "w", "b"}

// trio is three float32 params of one AdamW group ("emb" [5, 4], "w" [7], "b" [3]) and
// their float64 references.
type trio struct {
	opt    *Optimizer
	hp     GroupConfig
	params []*Param
	refs   []*refState
	rng    *rand.Rand
}

func newTrio(t *testing.T) *trio {
	t.Helper()
	f := &trio{opt: newOptimizer(t), hp: DefaultGroupConfig(), rng: rand.New(rand.NewSource(31))}
	f.hp["lr"] = 1e-2
	mustAddGroup(t, f.opt, f.hp)
	for i, shape := range [][]int64{{5, 4}, {7}, {3}} {
		init := randomValues(f.rng, product(shape))
		p, err := f.opt.AddParam(trioNames[i], 0, shape, init, nil)
		if err != nil {
			t.Fatalf("AddParam(%s): %v", trioNames[i], err)
		}
		f.params = append(f.params, p)
		f.refs = append(f.refs, newRefState(init))
	}
	return f
}

func (f *trio) freshGrads() [][]float32 {
	out := make([][]float32, len(f.params))
	for i, p := range f.params {
		out[i] = randomValues(f.rng, p.Numel())
	}
	return out
}

// snapshot is param i's values and moments as bits: an untouched param keeps them exactly.
func (f *trio) snapshot(t *testing.T, i int) []uint32 {
	t.Helper()
	var out []uint32
	for _, x := range f.params[i].Float32() {
		out = append(out, math.Float32bits(x))
	}
	for _, key := range []string{"exp_avg", "exp_avg_sq"} {
		state, err := f.opt.State(f.params[i], key)
		if err != nil {
			t.Fatalf("State(%s, %s): %v", trioNames[i], key, err)
		}
		for _, x := range state {
			out = append(out, math.Float32bits(x))
		}
	}
	return out
}

func (f *trio) checkAgainstReference(t *testing.T, what string) {
	t.Helper()
	for i, p := range f.params {
		expectClose(t, what+": "+trioNames[i], p.Float32(), f.refs[i].p)
	}
}

func (f *trio) paramSteps(t *testing.T) []int64 {
	t.Helper()
	steps, err := f.opt.ParamSteps(0, 3)
	if err != nil {
		t.Fatalf("ParamSteps: %v", err)
	}
	return steps
}

// expectError fails unless err is an *Error with status whose message holds every needle.
func expectError(t *testing.T, what string, err error, status Status, needles ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	e := asError(t, err)
	if e.Status != status {
		t.Errorf("%s: status %s, want %s (%v)", what, e.Status, status, e)
	}
	for _, needle := range needles {
		if !strings.Contains(e.Message, needle) {
			t.Errorf("%s: message %q lacks %q", what, e.Message, needle)
		}
	}
}

// A bfloat16 grad for a float32 param, a grad of the wrong length and a list of the wrong
// length are refused, naming the param; a refused call binds nothing (the step still
// finds no grad), and once grads are bound a refused call leaves them, buffers included,
// as they were.
func TestSetGradsIsCheckedAndAllOrNothing(t *testing.T) {
	f := newTrio(t)
	g := f.freshGrads()
	decoy := randomValues(f.rng, 7)
	expectError(t, "SetGrads(bf16 grad for a float32 param)",
		f.opt.SetGrads([]Grad{Float32Grad(g[0]), BFloat16Grad(make([]uint16, 7)), nil}),
		StatusMismatch, "sa_optimizer_set_grads", "param 'w'", "bfloat16")
	expectError(t, "SetGrads(2 values for 3)",
		f.opt.SetGrads([]Grad{Float32Grad(g[0]), nil, Float32Grad(g[2][:2])}),
		StatusInvalidArgument, "param 'b'", "2 values", "needs 3")
	expectError(t, "SetGrads(2 entries for 3 params)",
		f.opt.SetGrads([]Grad{Float32Grad(g[0]), nil}),
		StatusInvalidArgument, "n is 2 but the optimizer has 3 params")
	// Not even the nil entries of the refused calls took effect.
	expectError(t, "Step after refused bindings", f.opt.Step(), StatusState,
		"param 'emb' was never given a grad")

	if err := f.opt.SetGrads([]Grad{Float32Grad(g[0]), Float32Grad(g[1]), Float32Grad(g[2])}); err != nil {
		t.Fatalf("SetGrads: %v", err)
	}
	expectError(t, "SetGrads(fresh w, bf16 b)",
		f.opt.SetGrads([]Grad{Float32Grad(g[0]), Float32Grad(decoy), BFloat16Grad(make([]uint16, 3))}),
		StatusMismatch, "param 'b'")
	if err := f.opt.Step(); err != nil {
		t.Fatalf("Step: %v", err)
	}
	for i := range f.refs {
		f.refs[i].step(g[i], f.hp, 1, 1)
	}
	f.checkAgainstReference(t, "the grads bound before the refused call")
	if got := f.paramSteps(t); !reflect.DeepEqual(got, []int64{1, 1, 1}) {
		t.Errorf("ParamSteps = %v, want [1 1 1]", got)
	}
}

// Over four steps, params without a grad (a nil entry of SetGrads, ClearGrad) keep their
// values and moments bit for bit and their counts; the others follow the reference at
// their own counts.
func TestAParamWithoutAGradIsSkippedAndKeepsItsCount(t *testing.T) {
	f := newTrio(t)
	present := [][3]bool{{true, false, true}, {false, true, true}, {true, true, false}, {true, true, true}}
	counts := []int64{0, 0, 0}
	for step, has := range present {
		g := f.freshGrads()
		if step%2 == 0 {
			grads := make([]Grad, 3)
			for i := range grads {
				if has[i] {
					grads[i] = Float32Grad(g[i])
				}
			}
			if err := f.opt.SetGrads(grads); err != nil {
				t.Fatalf("step %d: SetGrads: %v", step, err)
			}
		} else {
			for i, p := range f.params {
				var err error
				if has[i] {
					err = f.opt.SetGrad(p, g[i])
				} else {
					err = f.opt.ClearGrad(p)
				}
				if err != nil {
					t.Fatalf("step %d: binding %s: %v", step, trioNames[i], err)
				}
			}
		}
		before := make([][]uint32, 3)
		for i := range before {
			before[i] = f.snapshot(t, i)
		}
		if err := f.opt.Step(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for i := range f.params {
			if has[i] {
				counts[i]++
				f.refs[i].step(g[i], f.hp, int(counts[i]), 1)
			} else if !reflect.DeepEqual(f.snapshot(t, i), before[i]) {
				t.Errorf("step %d: %s had no grad but changed", step, trioNames[i])
			}
		}
		f.checkAgainstReference(t, fmt.Sprintf("step %d", step))
		if got := f.paramSteps(t); !reflect.DeepEqual(got, counts) {
			t.Errorf("step %d: ParamSteps = %v, want %v", step, got, counts)
		}
	}
	if !reflect.DeepEqual(counts, []int64{3, 3, 3}) {
		t.Errorf("counts = %v", counts)
	}
	if n, err := f.opt.StepCount(0); err != nil || n != 4 {
		t.Errorf("StepCount = %d, %v; want 4 (the group counts the optimizer's steps)", n, err)
	}
	other := newOptimizer(t)
	expectError(t, "ClearGrad(foreign param)", other.ClearGrad(f.params[0]), StatusInvalidArgument,
		"does not belong to this optimizer")
}

// Counts [6, 6, 3] set through the binding give each param torch's bias correction at its
// own count (t = 7, 7, 4: lr / (1 - beta1^t) differs by 1.5x between 4 and 7); bad counts
// and ranges are refused and change nothing; a group's count sets its params' counts.
func TestPerParamStepsDriveBiasCorrection(t *testing.T) {
	f := newTrio(t)
	if err := f.opt.SetParamSteps(0, []int64{6, 6, 3}); err != nil {
		t.Fatalf("SetParamSteps: %v", err)
	}
	if got, err := f.opt.ParamSteps(1, 2); err != nil || !reflect.DeepEqual(got, []int64{6, 3}) {
		t.Fatalf("ParamSteps(1, 2) = %v, %v", got, err)
	}
	g := f.freshGrads()
	for i, p := range f.params {
		if err := f.opt.SetGrad(p, g[i]); err != nil {
			t.Fatalf("SetGrad: %v", err)
		}
	}
	if err := f.opt.Step(); err != nil {
		t.Fatalf("Step: %v", err)
	}
	for i, count := range []int{7, 7, 4} {
		f.refs[i].step(g[i], f.hp, count, 1)
	}
	f.checkAgainstReference(t, "after counts [6, 6, 3]")
	if got := f.paramSteps(t); !reflect.DeepEqual(got, []int64{7, 7, 4}) {
		t.Errorf("ParamSteps = %v, want [7 7 4]", got)
	}

	expectError(t, "SetParamSteps(-2)", f.opt.SetParamSteps(1, []int64{4, -2}), StatusInvalidArgument,
		"param 'b'", "-2")
	_, err := f.opt.ParamSteps(2, 2)
	expectError(t, "ParamSteps(2, 2)", err, StatusInvalidArgument, "not a range of params")
	_, err = f.opt.ParamSteps(0, -1)
	expectError(t, "ParamSteps(0, -1)", err, StatusInvalidArgument, "not a range of params")
	if got := f.paramSteps(t); !reflect.DeepEqual(got, []int64{7, 7, 4}) {
		t.Errorf("after refused calls ParamSteps = %v, want [7 7 4]", got)
	}
	if err := f.opt.SetStepCount(0, 10); err != nil {
		t.Fatalf("SetStepCount: %v", err)
	}
	if got := f.paramSteps(t); !reflect.DeepEqual(got, []int64{10, 10, 10}) {
		t.Errorf("after SetStepCount(10) ParamSteps = %v", got)
	}
}

// snapshots is every param's snapshot.
func (f *trio) snapshots(t *testing.T) [][]uint32 {
	t.Helper()
	out := make([][]uint32, len(f.params))
	for i := range out {
		out[i] = f.snapshot(t, i)
	}
	return out
}

func (f *trio) setGrads(t *testing.T, g [][]float32) {
	t.Helper()
	for i, p := range f.params {
		if err := f.opt.SetGrad(p, g[i]); err != nil {
			t.Fatalf("SetGrad(%s): %v", trioNames[i], err)
		}
	}
}

// Partial steps over {emb, b} and then {w} leave every param, moments included, with the
// bits one full step over the same grads gives, and the same per-param counts; only the
// full step advances the group's count.
func TestPartialStepsOverEveryParamGiveAFullStepsBits(t *testing.T) {
	partial, full := newTrio(t), newTrio(t)
	g := partial.freshGrads()
	partial.setGrads(t, g)
	full.setGrads(t, g)
	emb, w, b := partial.params[0], partial.params[1], partial.params[2]
	if _, err := partial.opt.StepParams([]*Param{emb, b}, StepArgs{}); err != nil {
		t.Fatalf("StepParams(emb, b): %v", err)
	}
	if got := partial.paramSteps(t); !reflect.DeepEqual(got, []int64{1, 0, 1}) {
		t.Errorf("after StepParams(emb, b) ParamSteps = %v, want [1 0 1]", got)
	}
	if report, err := partial.opt.StepParams([]*Param{w}, StepArgs{}); err != nil || report != (StepReport{}) {
		t.Fatalf("StepParams(w) = %+v, %v", report, err)
	}
	if err := full.opt.Step(); err != nil {
		t.Fatalf("Step: %v", err)
	}
	for i := range partial.params {
		if !reflect.DeepEqual(partial.snapshot(t, i), full.snapshot(t, i)) {
			t.Errorf("%s: the partial steps differ from the full step", trioNames[i])
		}
	}
	for _, f := range []*trio{partial, full} {
		if got := f.paramSteps(t); !reflect.DeepEqual(got, []int64{1, 1, 1}) {
			t.Errorf("ParamSteps = %v, want [1 1 1]", got)
		}
	}
	if n, err := partial.opt.StepCount(0); err != nil || n != 0 {
		t.Errorf("after partial steps StepCount = %d, %v; want 0 (partial steps leave the group's count)", n, err)
	}
	if n, err := full.opt.StepCount(0); err != nil || n != 1 {
		t.Errorf("after a full step StepCount = %d, %v; want 1", n, err)
	}
	for i := range full.refs {
		full.refs[i].step(g[i], full.hp, 1, 1)
	}
	full.checkAgainstReference(t, "the full step")
}

// A param left out of a partial step keeps its value and moments bit for bit and its
// count, with a grad bound or never given one; the listed ones (in any order) follow the
// reference, also with a loss scale. A listed param never given a grad is refused, and a
// found-inf flag skips the partial step.
func TestAParamLeftOutOfAPartialStepStaysAsItIs(t *testing.T) {
	f := newTrio(t)
	g := f.freshGrads()
	emb, w, b := f.params[0], f.params[1], f.params[2]
	for i, p := range []*Param{emb, w} {
		if err := f.opt.SetGrad(p, g[i]); err != nil {
			t.Fatalf("SetGrad(%s): %v", trioNames[i], err)
		}
	}
	_, err := f.opt.StepParams([]*Param{emb, b}, StepArgs{})
	expectError(t, "StepParams(b never given a grad)", err, StatusState, "param 'b' was never given a grad")
	before := f.snapshot(t, 2)
	if _, err := f.opt.StepParams([]*Param{w, emb}, StepArgs{InvGradScale: 0.5}); err != nil {
		t.Fatalf("StepParams(w, emb): %v", err)
	}
	if !reflect.DeepEqual(f.snapshot(t, 2), before) {
		t.Errorf("b was not listed but changed")
	}
	for i := 0; i < 2; i++ {
		f.refs[i].step(g[i], f.hp, 1, 0.5)
		expectClose(t, "listed: "+trioNames[i], f.params[i].Float32(), f.refs[i].p)
	}
	if got := f.paramSteps(t); !reflect.DeepEqual(got, []int64{1, 1, 0}) {
		t.Errorf("ParamSteps = %v, want [1 1 0]", got)
	}

	all := f.snapshots(t)
	report, err := f.opt.StepParams([]*Param{emb}, StepArgs{FoundInf: true})
	if err != nil || !report.Skipped {
		t.Fatalf("StepParams(emb, FoundInf) = %+v, %v; want skipped", report, err)
	}
	if !reflect.DeepEqual(f.snapshots(t), all) {
		t.Errorf("a skipped partial step changed a param")
	}
	if got := f.paramSteps(t); !reflect.DeepEqual(got, []int64{1, 1, 0}) {
		t.Errorf("after a skipped partial step ParamSteps = %v, want [1 1 0]", got)
	}
}

// A param listed twice, clipping, a param of another optimizer and a nil param are
// refused, and nothing changes: no value, moment or count.
func TestABadPartialStepIsRefusedAndChangesNothing(t *testing.T) {
	f := newTrio(t)
	f.setGrads(t, f.freshGrads())
	emb, w, b := f.params[0], f.params[1], f.params[2]
	before := f.snapshots(t)
	_, err := f.opt.StepParams([]*Param{emb, b, emb}, StepArgs{})
	expectError(t, "StepParams(emb, b, emb)", err, StatusInvalidArgument, "params[2] is 0 again", "param 'emb'")
	_, err = f.opt.StepParams([]*Param{w}, StepArgs{MaxGradNorm: 1})
	expectError(t, "StepParams(w, MaxGradNorm 1)", err, StatusInvalidArgument, "in a partial step")
	other := newTrio(t)
	_, err = f.opt.StepParams([]*Param{w, other.params[1]}, StepArgs{})
	expectError(t, "StepParams(another optimizer's param)", err, StatusInvalidArgument, "does not belong to this optimizer")
	_, err = f.opt.StepParams([]*Param{w, nil}, StepArgs{})
	expectError(t, "StepParams(nil param)", err, StatusInvalidArgument, "does not belong to this optimizer")
	if !reflect.DeepEqual(f.snapshots(t), before) {
		t.Errorf("a refused partial step changed a param")
	}
	if got := f.paramSteps(t); !reflect.DeepEqual(got, []int64{0, 0, 0}) {
		t.Errorf("after refused partial steps ParamSteps = %v, want [0 0 0]", got)
	}
	if n, err := f.opt.StepCount(0); err != nil || n != 0 {
		t.Errorf("StepCount = %d, %v; want 0", n, err)
	}
	if err := f.opt.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err = f.opt.StepParams([]*Param{w}, StepArgs{})
	expectError(t, "StepParams after Close", err, StatusState, "closed")
}
