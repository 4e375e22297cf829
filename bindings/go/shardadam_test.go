package shardadam

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"sync"
	"testing"
)

// ---- an independent float64 reference of the update in shardadam.h -------------------

type refState struct {
	p, m, v, vmax []float64
}

func newRefState(init []float32) *refState {
	r := &refState{p: make([]float64, len(init)), m: make([]float64, len(init)),
		v: make([]float64, len(init)), vmax: make([]float64, len(init))}
	for i, x := range init {
		r.p[i] = float64(x)
	}
	return r
}

// step applies one Adam/AdamW step (PyTorch semantics) at step count t.
func (r *refState) step(grad []float32, hp GroupConfig, t int, invGradScale float64) {
	bc1, bc2 := 1.0, 1.0
	if hp.BiasCorrection {
		bc1 = 1 - math.Pow(hp.Beta1, float64(t))
		bc2 = 1 - math.Pow(hp.Beta2, float64(t))
	}
	for i := range r.p {
		g := float64(grad[i]) * invGradScale
		if hp.Maximize {
			g = -g
		}
		if hp.WeightDecay != 0 {
			if hp.DecoupledWeightDecay {
				r.p[i] *= 1 - hp.LR*hp.WeightDecay
			} else {
				g += hp.WeightDecay * r.p[i]
			}
		}
		r.m[i] = hp.Beta1*r.m[i] + (1-hp.Beta1)*g
		r.v[i] = hp.Beta2*r.v[i] + (1-hp.Beta2)*g*g
		v := r.v[i]
		if hp.AMSGrad {
			r.vmax[i] = math.Max(r.vmax[i], r.v[i])
			v = r.vmax[i]
		}
		r.p[i] -= (hp.LR / bc1) * r.m[i] / (math.Sqrt(v)/math.Sqrt(bc2) + hp.Eps)
	}
}

// expectClose fails unless every got[i] is within float32 accuracy of want[i].
func expectClose(t *testing.T, what string, got []float32, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if diff := math.Abs(float64(got[i]) - want[i]); diff > 1e-6+1e-5*math.Abs(want[i]) {
			t.Fatalf("%s[%d] = %.9g, float64 reference %.9g (diff %.3g)", what, i, got[i], want[i], diff)
		}
	}
}

func randomValues(rng *rand.Rand, n int64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	return out
}

func newOptimizer(t *testing.T) *Optimizer {
	t.Helper()
	opt, err := NewOptimizer(&Config{NumThreads: 2})
	if err != nil {
		t.Fatalf("NewOptimizer: %v", err)
	}
	t.Cleanup(func() { opt.Close() })
	return opt
}

func mustAddGroup(t *testing.T, opt *Optimizer, hp GroupConfig) int {
	t.Helper()
	g, err := opt.AddGroup(hp)
	if err != nil {
		t.Fatalf("AddGroup: %v", err)
	}
	return g
}

// asError returns err as an *Error, failing the test when it is not one.
func asError(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v (%T), want a *shardadam.Error", err, err)
	}
	return e
}

// ---- specifications ------------------------------------------------------------------

func TestStatusNamesMatchTheLibrary(t *testing.T) {
	names := map[Status]string{
		StatusOK: "SA_OK", StatusInvalidArgument: "SA_ERR_INVALID_ARGUMENT",
		StatusUnsupported: "SA_ERR_UNSUPPORTED", StatusOutOfMemory: "SA_ERR_OUT_OF_MEMORY",
		StatusDevice: "SA_ERR_DEVICE", StatusComm: "SA_ERR_COMM", StatusIO: "SA_ERR_IO",
		StatusFormat: "SA_ERR_FORMAT", StatusMismatch: "SA_ERR_MISMATCH",
		StatusState: "SA_ERR_STATE", StatusInternal: "SA_ERR_INTERNAL",
	}
	for status, want := range names {
		if got := status.String(); got != want {
			t.Errorf("Status(%d).String() = %q, want %q", int(status), got, want)
		}
	}
	if got := Status(11).String(); got != "unknown sa_status" {
		t.Errorf("Status(11).String() = %q, want the library's unknown name", got)
	}
}

func TestVersionAndBuildInfoComeFromTheLoadedLibrary(t *testing.T) {
	if v := Version(); v < 100 { // 0.1.0 or later
		t.Errorf("Version() = %d", v)
	}
	if info := BuildInfo(); !strings.HasPrefix(info, "shardadam ") {
		t.Errorf("BuildInfo() = %q", info)
	}
}

func TestDefaultGroupConfigIsTorchAdamW(t *testing.T) {
	want := GroupConfig{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 1e-2,
		DecoupledWeightDecay: true, BiasCorrection: true}
	if got := DefaultGroupConfig(); got != want {
		t.Errorf("DefaultGroupConfig() = %+v, want %+v", got, want)
	}
}

func TestLocalBoxFollowsTorchChunk(t *testing.T) {
	// 10 rows over 4 ranks: chunks of 3, 3, 3, 1; 2 rows over 4 ranks: 1, 1, 0, 0.
	cases := []struct {
		rows, coord, wantRows, wantOffset int64
	}{{10, 0, 3, 0}, {10, 3, 1, 9}, {2, 1, 1, 1}, {2, 3, 0, 2}}
	for _, c := range cases {
		local, offset, err := LocalBox(Layout{GlobalShape: []int64{c.rows, 4}, MeshShape: []int64{4},
			MeshCoord: []int64{c.coord}, Placements: []Placement{Shard(0)}})
		if err != nil {
			t.Fatalf("LocalBox(%d rows, coord %d): %v", c.rows, c.coord, err)
		}
		if local[0] != c.wantRows || local[1] != 4 || offset[0] != c.wantOffset || offset[1] != 0 {
			t.Errorf("LocalBox(%d rows, coord %d) = %v at %v, want [%d 4] at [%d 0]",
				c.rows, c.coord, local, offset, c.wantRows, c.wantOffset)
		}
	}
}

// Two groups (AdamW; Adam with L2 decay, AMSGrad and maximize), a float32 param that is
// not sharded, a row shard of a mesh layout, a box-form shard and an empty shard; five
// steps with random grads and an LR change: params and states match a float64 reference.
func TestAdamStepsMatchFloat64Reference(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	opt := newOptimizer(t)

	adamw := DefaultGroupConfig()
	adamw.LR = 1e-2
	adam := GroupConfig{LR: 5e-3, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6, WeightDecay: 0.1,
		BiasCorrection: true, AMSGrad: true, Maximize: true}
	groups := []GroupConfig{adamw, adam}
	for _, hp := range groups {
		mustAddGroup(t, opt, hp)
	}

	meshRows := Layout{GlobalShape: []int64{10, 4}, MeshShape: []int64{4}, MeshCoord: []int64{3},
		Placements: []Placement{Shard(0)}}
	emptyRows := Layout{GlobalShape: []int64{2, 3}, MeshShape: []int64{4}, MeshCoord: []int64{3},
		Placements: []Placement{Shard(0)}}
	box := Layout{GlobalShape: []int64{7, 9}, GlobalOffset: []int64{2, 4}}
	specs := []struct {
		name   string
		group  int
		shape  []int64
		layout *Layout
	}{
		{"dense.w", 0, []int64{3, 5}, nil},
		{"rows.w", 0, []int64{1, 4}, &meshRows},
		{"box.w", 1, []int64{3, 5}, &box},
		{"empty.w", 1, []int64{0, 3}, &emptyRows},
		{"bias", 1, []int64{7}, nil},
	}
	params := make([]*Param, len(specs))
	refs := make([]*refState, len(specs))
	for i, s := range specs {
		init := randomValues(rng, product(s.shape))
		p, err := opt.AddParam(s.name, s.group, s.shape, init, &ParamOptions{Layout: s.layout})
		if err != nil {
			t.Fatalf("AddParam(%s): %v", s.name, err)
		}
		if p.Index != int64(i) || p.Numel() != product(s.shape) {
			t.Fatalf("AddParam(%s): index %d numel %d", s.name, p.Index, p.Numel())
		}
		params[i], refs[i] = p, newRefState(init)
	}

	const steps = 5
	for step := 1; step <= steps; step++ {
		if step == 3 { // an LR schedule changes group 0 between steps
			groups[0].LR = 3e-3
			if err := opt.SetLR(0, groups[0].LR); err != nil {
				t.Fatalf("SetLR: %v", err)
			}
		}
		for i, p := range params {
			if p.Numel() == 0 {
				continue // an empty shard needs no grad
			}
			grad := randomValues(rng, p.Numel())
			if err := opt.SetGrad(p, grad); err != nil {
				t.Fatalf("SetGrad(%s): %v", p.Name, err)
			}
			refs[i].step(grad, groups[specs[i].group], step, 1)
		}
		if err := opt.Step(); err != nil {
			t.Fatalf("Step %d: %v", step, err)
		}
		for i, p := range params {
			expectClose(t, fmt.Sprintf("step %d: %s", step, p.Name), p.Float32(), refs[i].p)
		}
	}

	for i, p := range params {
		for key, want := range map[string][]float64{"exp_avg": refs[i].m, "exp_avg_sq": refs[i].v} {
			got, err := opt.State(p, key)
			if err != nil {
				t.Fatalf("State(%s, %s): %v", p.Name, key, err)
			}
			expectClose(t, p.Name+"/"+key, got, want)
		}
		if specs[i].group == 1 {
			got, err := opt.State(p, "max_exp_avg_sq")
			if err != nil {
				t.Fatalf("State(%s, max_exp_avg_sq): %v", p.Name, err)
			}
			expectClose(t, p.Name+"/max_exp_avg_sq", got, refs[i].vmax)
		}
	}
	for g := range groups {
		if n, err := opt.StepCount(g); err != nil || n != steps {
			t.Errorf("StepCount(%d) = %d, %v; want %d", g, n, err, steps)
		}
	}
	if got, err := opt.Group(0); err != nil || got != groups[0] {
		t.Errorf("Group(0) = %+v, %v; want %+v", got, err, groups[0])
	}
}

func product(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// A bfloat16 param with float32 master weights and bfloat16 grads: the master follows the
// float32 reference, and the param is the master rounded to bfloat16.
func TestBFloat16ParamFollowsItsMasterWeights(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	opt := newOptimizer(t)
	hp := DefaultGroupConfig()
	hp.LR = 1e-2
	mustAddGroup(t, opt, hp)

	const n = 33
	init := make([]uint16, n)
	initWide := make([]float32, n)
	for i := range init {
		init[i] = Float32ToBFloat16(float32(rng.NormFloat64()))
		initWide[i] = BFloat16ToFloat32(init[i])
	}
	p, err := opt.AddParam16("emb.w", 0, BFloat16, []int64{n}, init, nil)
	if err != nil {
		t.Fatalf("AddParam16: %v", err)
	}
	if p.GradDType != BFloat16 {
		t.Fatalf("GradDType = %s, want the param's dtype", p.GradDType)
	}
	ref := newRefState(initWide)
	for step := 1; step <= 4; step++ {
		grad := make([]uint16, n)
		gradWide := make([]float32, n)
		for i := range grad {
			grad[i] = Float32ToBFloat16(float32(rng.NormFloat64()))
			gradWide[i] = BFloat16ToFloat32(grad[i])
		}
		if err := opt.SetGrad16(p, BFloat16, grad); err != nil {
			t.Fatalf("SetGrad16: %v", err)
		}
		if err := opt.Step(); err != nil {
			t.Fatalf("Step: %v", err)
		}
		ref.step(gradWide, hp, step, 1)
	}
	master, err := opt.State(p, "master")
	if err != nil {
		t.Fatalf("State(master): %v", err)
	}
	expectClose(t, "master", master, ref.p)
	for i, bits := range p.Bits16() {
		if want := Float32ToBFloat16(master[i]); bits != want {
			t.Fatalf("param[%d] = %#04x, want the master %v rounded to bfloat16 %#04x", i, bits, master[i], want)
		}
	}
}

// A bfloat16 param with an int16 remainder: param bits << 16 plus the remainder is the
// float32 value, which follows the reference.
func TestRemainderRestoresTheFloat32Value(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	opt := newOptimizer(t)
	hp := DefaultGroupConfig()
	hp.LR = 1e-2
	mustAddGroup(t, opt, hp)
	const n = 17
	init := make([]uint16, n)
	wide := make([]float32, n)
	for i := range init {
		init[i] = Float32ToBFloat16(float32(rng.NormFloat64()))
		wide[i] = BFloat16ToFloat32(init[i])
	}
	p, err := opt.AddParam16("w", 0, BFloat16, []int64{n}, init, &ParamOptions{Master: MasterRemainder})
	if err != nil {
		t.Fatalf("AddParam16: %v", err)
	}
	ref := newRefState(wide)
	for step := 1; step <= 3; step++ {
		grad := randomValues(rng, n) // float32 grads for a bfloat16 param
		if err := opt.SetGrad(p, grad); err == nil {
			t.Fatalf("SetGrad(float32) into a param registered with bfloat16 grads succeeded")
		}
		bits := make([]uint16, n)
		for i, g := range grad {
			bits[i] = Float32ToBFloat16(g)
			grad[i] = BFloat16ToFloat32(bits[i])
		}
		if err := opt.SetGrad16(p, BFloat16, bits); err != nil {
			t.Fatalf("SetGrad16: %v", err)
		}
		if err := opt.Step(); err != nil {
			t.Fatalf("Step: %v", err)
		}
		ref.step(grad, hp, step, 1)
	}
	rem, err := opt.StateInt16(p, "remainder")
	if err != nil {
		t.Fatalf("StateInt16(remainder): %v", err)
	}
	joined := make([]float32, n)
	for i, hi := range p.Bits16() {
		joined[i] = math.Float32frombits(uint32(hi)<<16 + uint32(int32(rem[i])))
	}
	expectClose(t, "param:remainder", joined, ref.p)
	if _, err := opt.State(p, "remainder"); asError(t, err).Status != StatusUnsupported {
		t.Errorf("State(remainder) = %v, want StatusUnsupported pointing at StateInt16", err)
	}
}

func TestLossScaleAndFoundInf(t *testing.T) {
	opt := newOptimizer(t)
	hp := DefaultGroupConfig()
	mustAddGroup(t, opt, hp)
	init := []float32{1, -2, 3, 0.5}
	p, err := opt.AddParam("w", 0, []int64{4}, init, nil)
	if err != nil {
		t.Fatalf("AddParam: %v", err)
	}
	grad := []float32{8, 4, -2, 0}
	if err := opt.SetGrad(p, grad); err != nil {
		t.Fatalf("SetGrad: %v", err)
	}

	report, err := opt.StepWith(StepArgs{FoundInf: true})
	if err != nil || !report.Skipped {
		t.Fatalf("StepWith(FoundInf) = %+v, %v; want skipped", report, err)
	}
	expectClose(t, "after a skipped step", p.Float32(), newRefState(init).p)
	if n, _ := opt.StepCount(0); n != 0 {
		t.Fatalf("a skipped step advanced the step count to %d", n)
	}

	report, err = opt.StepWith(StepArgs{InvGradScale: 0.25})
	if err != nil || report != (StepReport{}) {
		t.Fatalf("StepWith(InvGradScale) = %+v, %v; want a step without a norm", report, err)
	}
	ref := newRefState(init)
	ref.step(grad, hp, 1, 0.25)
	expectClose(t, "after a scaled step", p.Float32(), ref.p)
}

func TestErrorsCarryStatusAndMessageNamingTheParam(t *testing.T) {
	opt := newOptimizer(t)
	bad := DefaultGroupConfig()
	bad.Beta1 = 1.5
	_, err := opt.AddGroup(bad)
	if e := asError(t, err); e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "beta1") {
		t.Errorf("AddGroup(beta1 1.5): %v", err)
	}
	mustAddGroup(t, opt, DefaultGroupConfig())

	w, err := opt.AddParam("layers.0.w", 0, []int64{2, 3}, make([]float32, 6),
		&ParamOptions{GradDType: BFloat16})
	if err != nil {
		t.Fatalf("AddParam: %v", err)
	}
	// The library refuses float32 grads for a param registered with bfloat16 grads.
	err = opt.SetGrad(w, make([]float32, 6))
	if e := asError(t, err); e.Status != StatusMismatch || !strings.Contains(e.Message, "layers.0.w") ||
		!strings.Contains(e.Message, "bfloat16") {
		t.Errorf("SetGrad(float32 into bfloat16): %v", err)
	}
	// No grad bound: the step refuses and names the param.
	err = opt.Step()
	if e := asError(t, err); e.Status != StatusState || !strings.Contains(e.Message, "layers.0.w") {
		t.Errorf("Step without a grad: %v", err)
	}
	// Names are unique.
	_, err = opt.AddParam("layers.0.w", 0, []int64{1}, []float32{0}, nil)
	if e := asError(t, err); e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "layers.0.w") {
		t.Errorf("AddParam(duplicate name): %v", err)
	}
	// A shard whose shape disagrees with its layout.
	_, err = opt.AddParam("layers.1.w", 0, []int64{2, 4}, make([]float32, 8), &ParamOptions{Layout: &Layout{
		GlobalShape: []int64{10, 4}, MeshShape: []int64{4}, MeshCoord: []int64{0}, Placements: []Placement{Shard(0)}}})
	if e := asError(t, err); e.Status == StatusOK || !strings.Contains(e.Message, "layers.1.w") {
		t.Errorf("AddParam(shape off its layout): %v", err)
	}
	// Errors found by the binding itself are *Error values too.
	_, err = opt.AddParam("layers.2.w", 0, []int64{2, 2}, make([]float32, 3), nil)
	if e := asError(t, err); e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "layers.2.w") {
		t.Errorf("AddParam(3 values for 4): %v", err)
	}
	_, err = opt.State(w, "no_such_state")
	if e := asError(t, err); e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "no_such_state") {
		t.Errorf("State(no_such_state): %v", err)
	}
	// A failed call leaves the optimizer usable: nothing was half-added.
	if err := opt.SetGrad16(w, BFloat16, make([]uint16, 6)); err != nil {
		t.Fatalf("SetGrad16 after the failures: %v", err)
	}
	if err := opt.Step(); err != nil {
		t.Fatalf("Step after the failures: %v", err)
	}
}

// Each failing call returns its own message even while goroutines fail concurrently on
// other optimizers and on the handle-less path, and migrate between OS threads: the text
// is copied inside the native call that failed.
func TestConcurrentErrorsKeepTheirOwnMessages(t *testing.T) {
	const workers, rounds = 8, 200
	var wg sync.WaitGroup
	failures := make(chan string, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			opt, err := NewOptimizer(&Config{NumThreads: 1})
			if err != nil {
				failures <- err.Error()
				return
			}
			defer opt.Close()
			if _, err := opt.AddGroup(DefaultGroupConfig()); err != nil {
				failures <- err.Error()
				return
			}
			name := fmt.Sprintf("worker%d.w", w)
			p, err := opt.AddParam(name, 0, []int64{3}, make([]float32, 3), &ParamOptions{GradDType: BFloat16})
			if err != nil {
				failures <- err.Error()
				return
			}
			for r := 0; r < rounds; r++ {
				// Per handle: a mismatch naming this worker's param.
				if err := opt.SetGrad(p, make([]float32, 3)); err == nil || !strings.Contains(err.Error(), name) {
					failures <- fmt.Sprintf("worker %d round %d: SetGrad: %v", w, r, err)
					return
				}
				// Handle-less (thread-local in the library): a coordinate unique to this worker.
				coord := int64(100 + w)
				_, _, err := LocalBox(Layout{GlobalShape: []int64{4}, MeshShape: []int64{2},
					MeshCoord: []int64{coord}, Placements: []Placement{Shard(0)}})
				if err == nil || !strings.Contains(err.Error(), fmt.Sprint(coord)) {
					failures <- fmt.Sprintf("worker %d round %d: LocalBox: %v", w, r, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}
}

func TestCloseReleasesEverythingAndIsIdempotent(t *testing.T) {
	opt, err := NewOptimizer(nil)
	if err != nil {
		t.Fatalf("NewOptimizer: %v", err)
	}
	mustAddGroup(t, opt, DefaultGroupConfig())
	p, err := opt.AddParam("w", 0, []int64{2}, []float32{1, 2}, nil)
	if err != nil {
		t.Fatalf("AddParam: %v", err)
	}
	if err := opt.SetGrad(p, []float32{1, 1}); err != nil {
		t.Fatalf("SetGrad: %v", err)
	}
	if err := opt.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := opt.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if p.Float32() != nil {
		t.Errorf("Param.Float32 after Close is not nil")
	}
	if e := asError(t, opt.Step()); e.Status != StatusState || !strings.Contains(e.Message, "closed") {
		t.Errorf("Step after Close: %v", e)
	}
}

// Two ranks, each holding half the rows of "w" and a replica of "bias", save after three
// steps; one rank holding the whole tensors loads both files: its states are the ranks'
// states put together, and the groups' step counts and hyperparameters come back.
func TestSaveOnTwoRanksLoadOnOne(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	dir := t.TempDir()
	hp := DefaultGroupConfig()
	hp.LR = 1e-2
	global := []int64{5, 3}
	paths := make([]string, 2)
	saved := map[string][]float32{} // "<param>/<key>" -> the ranks' states, in global order
	for r := 0; r < 2; r++ {
		opt := newOptimizer(t)
		mustAddGroup(t, opt, hp)
		rows := Layout{GlobalShape: global, MeshShape: []int64{2}, MeshCoord: []int64{int64(r)},
			Placements: []Placement{Shard(0)}}
		local, _, err := LocalBox(rows)
		if err != nil {
			t.Fatal(err)
		}
		w, err := opt.AddParam("w", 0, local, randomValues(rng, product(local)), &ParamOptions{Layout: &rows})
		if err != nil {
			t.Fatal(err)
		}
		replicated := Layout{GlobalShape: []int64{4}, MeshShape: []int64{2}, MeshCoord: []int64{int64(r)},
			Placements: []Placement{Replicate()}}
		bias, err := opt.AddParam("bias", 0, []int64{4}, randomValues(rng, 4), &ParamOptions{Layout: &replicated})
		if err != nil {
			t.Fatal(err)
		}
		for step := 0; step < 3; step++ {
			for _, p := range []*Param{w, bias} {
				if err := opt.SetGrad(p, randomValues(rng, p.Numel())); err != nil {
					t.Fatal(err)
				}
			}
			if err := opt.Step(); err != nil {
				t.Fatal(err)
			}
		}
		for _, key := range []string{"exp_avg", "exp_avg_sq"} {
			s, err := opt.State(w, key)
			if err != nil {
				t.Fatal(err)
			}
			saved["w/"+key] = append(saved["w/"+key], s...) // rank 0's rows come first
			if r == 0 {
				if saved["bias/"+key], err = opt.State(bias, key); err != nil {
					t.Fatal(err)
				}
			}
		}
		paths[r] = fmt.Sprintf("%s/rank%d.safetensors", dir, r)
		if err := opt.Save(paths[r]); err != nil {
			t.Fatalf("Save(rank %d): %v", r, err)
		}
	}

	whole := newOptimizer(t)
	other := hp
	other.LR = 0.5
	mustAddGroup(t, whole, other)
	w, err := whole.AddParam("w", 0, global, make([]float32, product(global)), nil)
	if err != nil {
		t.Fatal(err)
	}
	bias, err := whole.AddParam("bias", 0, []int64{4}, make([]float32, 4), nil)
	if err != nil {
		t.Fatal(err)
	}

	// Rank 0's file alone leaves rows 3 and 4 uncovered: refused, naming the param, and
	// nothing changes.
	err = whole.Load(paths[:1], nil)
	if e := asError(t, err); e.Status != StatusMismatch || !strings.Contains(e.Message, "'w'") {
		t.Errorf("Load(rank 0 only): %v", err)
	}
	if s, _ := whole.State(w, "exp_avg"); s[0] != 0 {
		t.Errorf("a refused Load changed the state")
	}
	err = whole.Load([]string{dir + "/missing.safetensors"}, nil)
	if e := asError(t, err); e.Status != StatusIO || !strings.Contains(e.Message, "missing.safetensors") {
		t.Errorf("Load(missing file): %v", err)
	}

	if err := whole.Load(paths, nil); err != nil {
		t.Fatalf("Load(both ranks): %v", err)
	}
	for name, p := range map[string]*Param{"w": w, "bias": bias} {
		for _, key := range []string{"exp_avg", "exp_avg_sq"} {
			got, err := whole.State(p, key)
			if err != nil {
				t.Fatal(err)
			}
			want := saved[name+"/"+key]
			if len(got) != len(want) {
				t.Fatalf("%s/%s: %d values, want %d", name, key, len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%s/%s[%d] = %v, saved %v", name, key, i, got[i], want[i])
				}
			}
		}
	}
	if n, err := whole.StepCount(0); err != nil || n != 3 {
		t.Errorf("StepCount after Load = %d, %v; want 3", n, err)
	}
	if g, err := whole.Group(0); err != nil || g.LR != hp.LR {
		t.Errorf("Group(0).LR after Load = %v, %v; want %v", g.LR, err, hp.LR)
	}
}
