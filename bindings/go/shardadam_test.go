package shardadam

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/signal"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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

// step applies one Adam/AdamW step (PyTorch semantics) at step count t. hp must name
// every field the update reads (start from DefaultGroupConfig): a missing one would read
// as 0 here while the library uses its default.
func (r *refState) step(grad []float32, hp GroupConfig, t int, invGradScale float64) {
	lr, beta1, beta2, eps, decay := hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
	bc1, bc2 := 1.0, 1.0
	if hp["bias_correction"] != 0 {
		bc1 = 1 - math.Pow(beta1, float64(t))
		bc2 = 1 - math.Pow(beta2, float64(t))
	}
	for i := range r.p {
		g := float64(grad[i]) * invGradScale
		if hp["maximize"] != 0 {
			g = -g
		}
		if decay != 0 {
			if hp["decoupled_weight_decay"] != 0 {
				r.p[i] *= 1 - lr*decay
			} else {
				g += decay * r.p[i]
			}
		}
		r.m[i] = beta1*r.m[i] + (1-beta1)*g
		r.v[i] = beta2*r.v[i] + (1-beta2)*g*g
		v := r.v[i]
		if hp["amsgrad"] != 0 {
			r.vmax[i] = math.Max(r.vmax[i], r.v[i])
			v = r.vmax[i]
		}
		r.p[i] -= (lr / bc1) * r.m[i] / (math.Sqrt(v)/math.Sqrt(bc2) + eps)
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

// torchAdamW is torch.optim.AdamW's documented defaults, in sa_group_config's member
// order, with the flags whose values AdamW implies (decoupled decay, bias correction).
var torchAdamW = []struct {
	name  string
	flag  bool
	value float64
}{
	{"lr", false, 1e-3}, {"beta1", false, 0.9}, {"beta2", false, 0.999}, {"eps", false, 1e-8},
	{"weight_decay", false, 1e-2}, {"decoupled_weight_decay", true, 1},
	{"bias_correction", true, 1}, {"maximize", true, 0}, {"amsgrad", true, 0},
}

func TestDefaultGroupConfigIsTorchAdamW(t *testing.T) {
	got := DefaultGroupConfig()
	for _, want := range torchAdamW {
		if v, ok := got[want.name]; !ok || v != want.value {
			t.Errorf("DefaultGroupConfig()[%q] = %v (present %v), want torch's %v", want.name, v, ok, want.value)
		}
	}
	// A new group holds exactly these values, whatever fields the library has.
	opt := newOptimizer(t)
	g := mustAddGroup(t, opt, nil)
	if cfg, err := opt.Group(g); err != nil || !reflect.DeepEqual(cfg, got) {
		t.Errorf("Group of AddGroup(nil) = %v, %v; want DefaultGroupConfig() %v", cfg, err, got)
	}
}

// The fields are the library's table (sa_group_config_field): torch's nine in
// sa_group_config's member order (a later field can only be appended), each with the
// type, default and rule shardadam.h states, and only amsgrad fixed once a param exists.
func TestGroupFieldsListTheLibrarysFieldsInStructOrder(t *testing.T) {
	fields := GroupFields()
	if len(fields) < len(torchAdamW) {
		t.Fatalf("GroupFields() has %d fields, want at least %d: %+v", len(fields), len(torchAdamW), fields)
	}
	for i, want := range torchAdamW {
		f := fields[i]
		if f.Name != want.name || f.Flag != want.flag || f.Default != want.value {
			t.Errorf("GroupFields()[%d] = %q (flag %v, default %v), want %q (flag %v, default %v)",
				i, f.Name, f.Flag, f.Default, want.name, want.flag, want.value)
		}
		if f.FixedWithParams != (want.name == "amsgrad") {
			t.Errorf("%s: FixedWithParams = %v", f.Name, f.FixedWithParams)
		}
	}
	for _, f := range fields {
		if f.Rule == "" || f.Doc == "" {
			t.Errorf("%s: rule %q, doc %q: want both from the library", f.Name, f.Rule, f.Doc)
		}
		if f.Flag && (f.Min != 0 || f.Max != 1 || !f.MaxInclusive || f.Rule != "0 or 1") {
			t.Errorf("%s: a flag with range [%v, %v] (inclusive %v), rule %q", f.Name, f.Min, f.Max, f.MaxInclusive, f.Rule)
		}
		if beyond := f.Default > f.Max || (f.Default == f.Max && !f.MaxInclusive); f.Default < f.Min || beyond {
			t.Errorf("%s: default %v outside its own range (%s)", f.Name, f.Default, f.Rule)
		}
	}
	fields[0].Name = "changed" // the caller's copy
	if GroupFields()[0].Name != torchAdamW[0].name {
		t.Errorf("changing the result of GroupFields changed the table")
	}
}

// A config names only the fields it changes: AddGroup takes the defaults for the others,
// SetGroup keeps the group's values.
func TestGroupConfigsNameOnlyTheFieldsTheyChange(t *testing.T) {
	opt := newOptimizer(t)
	g := mustAddGroup(t, opt, GroupConfig{"lr": 0.5, "maximize": 1})
	want := DefaultGroupConfig()
	want["lr"], want["maximize"] = 0.5, 1
	if got, err := opt.Group(g); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Group after AddGroup(lr, maximize) = %v, %v; want %v", got, err, want)
	}
	if err := opt.SetGroup(g, GroupConfig{"beta1": 0.5, "weight_decay": 0}); err != nil {
		t.Fatalf("SetGroup(beta1, weight_decay): %v", err)
	}
	want["beta1"], want["weight_decay"] = 0.5, 0
	if got, err := opt.Group(g); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Group after SetGroup(beta1, weight_decay) = %v, %v; want %v", got, err, want)
	}
}

// another returns a valid value of f other than its default, by the table's range.
func another(f FieldInfo) float64 {
	switch {
	case f.Flag:
		return 1 - f.Default
	case f.Integer && f.Default != f.Min:
		return f.Min
	case f.Integer:
		return f.Min + 1
	case f.Default != f.Min:
		return f.Min
	case math.IsInf(f.Max, 1):
		return f.Min + 1
	}
	return (f.Min + f.Max) / 2
}

// A field the table marks FixedWithParams may change while its group is empty and is
// refused with StatusState, naming it, once the group holds a param.
func TestFixedFieldsCannotChangeOnceTheGroupHoldsAParam(t *testing.T) {
	opt := newOptimizer(t)
	g := mustAddGroup(t, opt, nil)
	for _, f := range GroupFields() {
		if !f.FixedWithParams {
			continue
		}
		if err := opt.SetGroup(g, GroupConfig{f.Name: another(f)}); err != nil {
			t.Fatalf("SetGroup(%s) of an empty group: %v", f.Name, err)
		}
		if err := opt.SetGroup(g, GroupConfig{f.Name: f.Default}); err != nil {
			t.Fatalf("SetGroup(%s) back: %v", f.Name, err)
		}
	}
	if _, err := opt.AddParam("w", g, []int64{2}, []float32{1, 2}, nil); err != nil {
		t.Fatalf("AddParam: %v", err)
	}
	for _, f := range GroupFields() {
		err := opt.SetGroup(g, GroupConfig{f.Name: another(f)})
		if !f.FixedWithParams {
			if err != nil {
				t.Errorf("SetGroup(%s) of a group with a param: %v", f.Name, err)
			}
			continue
		}
		if e := asError(t, err); e.Status != StatusState || !strings.Contains(e.Message, f.Name) {
			t.Errorf("SetGroup(%s) of a group with a param: %v, want StatusState naming it", f.Name, err)
		}
	}
}

// Names and values are checked by the library, not the binding: an unknown name, a flag
// other than 0 or 1 or a value outside a field's range is StatusInvalidArgument naming it
// (and, for a name, the known ones), and nothing changes.
func TestBadGroupFieldsAreRefusedByNameAndChangeNothing(t *testing.T) {
	opt := newOptimizer(t)
	g := mustAddGroup(t, opt, nil)
	before, err := opt.Group(g)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		cfg  GroupConfig
		want []string // what the message must say
	}{
		{GroupConfig{"dampening": 0.9}, []string{"dampening", "lr", "amsgrad"}},
		{GroupConfig{"lr": 0.1, "ns_steps": 100}, []string{"ns_steps"}},
		{GroupConfig{"update_rule": 0.5}, []string{"update_rule"}},
		{GroupConfig{"amsgrad": 2}, []string{"amsgrad"}},
		{GroupConfig{"beta1": 1.5}, []string{"beta1"}},
		{GroupConfig{"eps": math.NaN()}, []string{"eps"}},
	}
	for _, c := range cases {
		_, addErr := opt.AddGroup(c.cfg)
		setErr := opt.SetGroup(g, c.cfg)
		for what, err := range map[string]error{"AddGroup": addErr, "SetGroup": setErr} {
			e := asError(t, err)
			if e.Status != StatusInvalidArgument {
				t.Errorf("%s(%v): status %s, want StatusInvalidArgument", what, c.cfg, e.Status)
			}
			for _, word := range c.want {
				if !strings.Contains(e.Message, word) {
					t.Errorf("%s(%v): message %q does not name %q", what, c.cfg, e.Message, word)
				}
			}
		}
	}
	// The same bad config gives the same message every time (map order does not leak).
	bad := GroupConfig{"lr": -1, "beta1": -1, "eps": -1, "weight_decay": -1}
	_, first := opt.AddGroup(bad)
	for i := 0; i < 20; i++ {
		if _, err := opt.AddGroup(bad); err.Error() != first.Error() {
			t.Fatalf("AddGroup(%v): %q, then %q", bad, first, err)
		}
	}
	if after, err := opt.Group(g); err != nil || !reflect.DeepEqual(after, before) {
		t.Errorf("Group after refused SetGroups = %v, %v; want it unchanged, %v", after, err, before)
	}
	if _, err := opt.Group(1); err == nil {
		t.Errorf("a refused AddGroup added a group")
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

// torchChunk is this coordinate's part of a dim of n split k ways by torch.chunk: chunks
// of ceil(n/k), so trailing coordinates get a smaller chunk or none.
func torchChunk(n, k, coord int64) (size, offset int64) {
	chunk := (n + k - 1) / k
	offset = coord * chunk
	if offset > n {
		offset = n
	}
	size = chunk
	if n-offset < size {
		size = n - offset
	}
	return size, offset
}

// Every coordinate of a 4x3 mesh holds a bfloat16 shard of a tensor split along both dims
// (some shards smaller, some empty): Param.Info reports what was registered and what the
// library resolved, the global shape and the torch.chunk offset of each coordinate.
func TestParamInfoReportsTheShardsPlaceAndWhatTheLibraryResolved(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	opt := newOptimizer(t)
	mustAddGroup(t, opt, DefaultGroupConfig())
	group := mustAddGroup(t, opt, GroupConfig{"lr": 1e-3})
	mesh := []int64{4, 3}
	for _, global := range [][]int64{{10, 7}, {2, 5}} {
		for r := int64(0); r < mesh[0]; r++ {
			for c := int64(0); c < mesh[1]; c++ {
				name := fmt.Sprintf("w%v.%d.%d", global, r, c)
				rows, rowOffset := torchChunk(global[0], mesh[0], r)
				cols, colOffset := torchChunk(global[1], mesh[1], c)
				local := []int64{rows, cols}
				init := make([]uint16, rows*cols)
				for i := range init {
					init[i] = Float32ToBFloat16(float32(rng.NormFloat64()))
				}
				layout := Layout{GlobalShape: global, MeshShape: mesh, MeshCoord: []int64{r, c},
					Placements: []Placement{Shard(0), Shard(1)}}
				p, err := opt.AddParam16(name, group, BFloat16, local, init, &ParamOptions{Layout: &layout,
					GradDType: Float32, MomentDType: BFloat16, Master: MasterRemainder})
				if err != nil {
					t.Fatalf("AddParam16(%s): %v", name, err)
				}
				got, err := p.Info()
				if err != nil {
					t.Fatalf("%s: Info: %v", name, err)
				}
				want := ParamInfo{Index: p.Index, Name: name, Group: int32(group), LocalShape: local,
					GlobalShape: global, GlobalOffset: []int64{rowOffset, colOffset}, Numel: rows * cols,
					DType: BFloat16, GradDType: Float32, MomentDType: BFloat16, Master: MasterRemainder,
					Device: CPU(), Scaling: ScalingNone, Margin: 0}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: Info() =\n  %+v\nwant\n  %+v", name, got, want)
				}
			}
		}
	}
	// The defaults the library resolves: the grad and moment dtypes of a float32 param, and
	// no master (never MasterAuto).
	p, err := opt.AddParam("bias", 0, []int64{7}, randomValues(rng, 7), nil)
	if err != nil {
		t.Fatalf("AddParam(bias): %v", err)
	}
	got, err := p.Info()
	if err != nil {
		t.Fatalf("bias: Info: %v", err)
	}
	want := ParamInfo{Index: p.Index, Name: "bias", Group: 0, LocalShape: []int64{7}, GlobalShape: []int64{7},
		GlobalOffset: []int64{0}, Numel: 7, DType: Float32, GradDType: Float32, MomentDType: Float32,
		Master: MasterNone, Device: CPU(), Scaling: ScalingNone}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("bias: Info() =\n  %+v\nwant\n  %+v", got, want)
	}
}

// Two groups (AdamW; Adam with L2 decay, AMSGrad and maximize), a float32 param that is
// not sharded, a row shard of a mesh layout, a box-form shard and an empty shard; five
// steps with random grads and an LR change: params and states match a float64 reference.
func TestAdamStepsMatchFloat64Reference(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	opt := newOptimizer(t)

	adamw := DefaultGroupConfig()
	adamw["lr"] = 1e-2
	adam := GroupConfig{"lr": 5e-3, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1,
		"decoupled_weight_decay": 0, "bias_correction": 1, "amsgrad": 1, "maximize": 1}
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
			groups[0]["lr"] = 3e-3
			if err := opt.SetLR(0, groups[0]["lr"]); err != nil {
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
	for g, want := range groups {
		got, err := opt.Group(g)
		if err != nil || len(got) != len(GroupFields()) {
			t.Fatalf("Group(%d) = %v, %v; want every field of GroupFields", g, got, err)
		}
		for name, value := range want { // the fields the test set (a field added later has its default)
			if got[name] != value {
				t.Errorf("Group(%d)[%q] = %v; want %v", g, name, got[name], value)
			}
		}
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
	hp["lr"] = 1e-2
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
	hp["lr"] = 1e-2
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

// A CPU param's state is host memory already: StateOnHost and StateOnHostCPUStep are
// accepted, Info reports StateOnDevice, and the steps give the same bytes as the default
// placement. A value that is no StatePlacement is refused by the library.
func TestStateOnHostOfACPUParamResolvesToDevice(t *testing.T) {
	rng := rand.New(rand.NewSource(13))
	opt := newOptimizer(t)
	hp := DefaultGroupConfig()
	hp["lr"] = 1e-2
	mustAddGroup(t, opt, hp)
	const n = 23
	init := randomValues(rng, n)
	def, err := opt.AddParam("default", 0, []int64{n}, init, nil)
	if err != nil {
		t.Fatalf("AddParam(default): %v", err)
	}
	host, err := opt.AddParam("host", 0, []int64{n}, init, &ParamOptions{StatePlacement: StateOnHost})
	if err != nil {
		t.Fatalf("AddParam(StateOnHost): %v", err)
	}
	cpuStep, err := opt.AddParam("cpu_step", 0, []int64{n}, init,
		&ParamOptions{StatePlacement: StateOnHostCPUStep})
	if err != nil {
		t.Fatalf("AddParam(StateOnHostCPUStep): %v", err)
	}
	for _, p := range []*Param{def, host, cpuStep} {
		info, err := p.Info()
		if err != nil {
			t.Fatalf("%s: Info: %v", p.Name, err)
		}
		if info.StatePlacement != StateOnDevice {
			t.Errorf("%s: Info().StatePlacement = %d, want StateOnDevice", p.Name, info.StatePlacement)
		}
	}
	for step := 1; step <= 3; step++ {
		grad := randomValues(rng, n)
		if err := opt.SetGrad(def, grad); err != nil {
			t.Fatalf("SetGrad(default): %v", err)
		}
		if err := opt.SetGrad(host, grad); err != nil {
			t.Fatalf("SetGrad(host): %v", err)
		}
		if err := opt.SetGrad(cpuStep, grad); err != nil {
			t.Fatalf("SetGrad(cpu_step): %v", err)
		}
		if err := opt.Step(); err != nil {
			t.Fatalf("Step %d: %v", step, err)
		}
	}
	for i, v := range def.Float32() {
		if v == init[i] {
			t.Fatalf("default[%d] = %g after 3 steps, as it started", i, v)
		}
	}
	if !bytes.Equal(host.Bytes(), def.Bytes()) {
		t.Errorf("StateOnHost stepped to\n  %v\nthe default to\n  %v", host.Float32(), def.Float32())
	}
	if !bytes.Equal(cpuStep.Bytes(), def.Bytes()) {
		t.Errorf("StateOnHostCPUStep stepped to\n  %v\nthe default to\n  %v", cpuStep.Float32(), def.Float32())
	}

	_, err = opt.AddParam("bad", 0, []int64{n}, init, &ParamOptions{StatePlacement: StatePlacement(5)})
	if e := asError(t, err); e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "state_placement is 5") {
		t.Errorf("AddParam(StatePlacement(5)): %v", err)
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
	_, err := opt.AddGroup(GroupConfig{"beta1": 1.5})
	if e := asError(t, err); e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "beta1") {
		t.Errorf("AddGroup(beta1 1.5): %v", err)
	}
	mustAddGroup(t, opt, nil)

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
	if info, err := p.Info(); err != nil || info.Name != "w" {
		t.Fatalf("Param.Info before Close = %+v, %v", info, err)
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
	if info, err := p.Info(); err == nil || asError(t, err).Status != StatusState || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Param.Info after Close = %+v, %v; want StatusState saying the optimizer is closed", info, err)
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
	hp["lr"] = 1e-2
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
	mustAddGroup(t, whole, GroupConfig{"lr": 0.5})
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
	if g, err := whole.Group(0); err != nil || !reflect.DeepEqual(g, hp) {
		t.Errorf("Group(0) after Load = %v, %v; want the saved %v", g, err, hp)
	}
}

// asyncFixture is an optimizer with a [1024, 1024] "w" (8 MiB of state, so that a write
// is rarely over before the next call) and a small "bias", and a function that steps it
// with random grads.
func asyncFixture(t *testing.T, seed int64) (*Optimizer, []*Param, func()) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	opt := newOptimizer(t)
	hp := DefaultGroupConfig()
	hp["lr"] = 1e-2
	mustAddGroup(t, opt, hp)
	var params []*Param
	for _, s := range []struct {
		name  string
		shape []int64
	}{{"w", []int64{1024, 1024}}, {"bias", []int64{7}}} {
		p, err := opt.AddParam(s.name, 0, s.shape, randomValues(rng, product(s.shape)), nil)
		if err != nil {
			t.Fatal(err)
		}
		params = append(params, p)
	}
	step := func() {
		t.Helper()
		for _, p := range params {
			if err := opt.SetGrad(p, randomValues(rng, p.Numel())); err != nil {
				t.Fatal(err)
			}
		}
		if err := opt.Step(); err != nil {
			t.Fatal(err)
		}
	}
	return opt, params, step
}

// states copies every state of params out of opt: "<param>/<key>" -> values.
func states(t *testing.T, opt *Optimizer, params []*Param) map[string][]float32 {
	t.Helper()
	out := map[string][]float32{}
	for _, p := range params {
		for _, key := range []string{"exp_avg", "exp_avg_sq"} {
			s, err := opt.State(p, key)
			if err != nil {
				t.Fatal(err)
			}
			out[p.Name+"/"+key] = s
		}
	}
	return out
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// expectOnlyFiles fails unless dir holds exactly the files named (no temporary file left).
func expectOnlyFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	sort.Strings(got)
	sort.Strings(names)
	if strings.Join(got, " ") != strings.Join(names, " ") {
		t.Errorf("%s holds %q, want %q", dir, got, names)
	}
}

// SaveAsync writes the state of its call: a step right after it returns changes the
// state, not the file, which is byte for byte a Save taken before the step, and which
// Load turns back into the pre-step state. A second SaveAsync after the step (it waits
// for the first) writes the post-step state.
func TestSaveAsyncWritesTheStateOfItsCall(t *testing.T) {
	dir := t.TempDir()
	opt, params, step := asyncFixture(t, 5)
	step()
	step()
	before := states(t, opt, params)
	if err := opt.Save(dir + "/sync.safetensors"); err != nil {
		t.Fatal(err)
	}
	job, err := opt.SaveAsync(dir + "/async.safetensors")
	if err != nil {
		t.Fatalf("SaveAsync: %v", err)
	}
	t.Cleanup(func() { job.Close() })
	step() // at once: the job may still be writing
	if done, err := job.Done(); err != nil {
		t.Fatalf("Done: %v", err)
	} else if !done {
		t.Logf("the job was still writing after the step")
	}
	after := states(t, opt, params)
	if reflect.DeepEqual(after, before) {
		t.Fatal("the step did not change the state: the test would prove nothing")
	}
	job2, err := opt.SaveAsync(dir + "/async2.safetensors")
	if err != nil {
		t.Fatalf("second SaveAsync: %v", err)
	}
	t.Cleanup(func() { job2.Close() })
	if err := job.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if err := job2.Wait(); err != nil {
		t.Fatalf("Wait (second job): %v", err)
	}
	if err := opt.Save(dir + "/sync2.safetensors"); err != nil {
		t.Fatal(err)
	}

	sync, async := readFile(t, dir+"/sync.safetensors"), readFile(t, dir+"/async.safetensors")
	if !bytes.Equal(async, sync) {
		t.Errorf("SaveAsync's file (%d bytes) differs from Save's before the step (%d bytes)", len(async), len(sync))
	}
	sync2, async2 := readFile(t, dir+"/sync2.safetensors"), readFile(t, dir+"/async2.safetensors")
	if !bytes.Equal(async2, sync2) {
		t.Errorf("the second SaveAsync's file differs from Save's after the step")
	}
	if bytes.Equal(async2, async) {
		t.Errorf("the files before and after the step are the same")
	}
	expectOnlyFiles(t, dir, "sync.safetensors", "async.safetensors", "sync2.safetensors", "async2.safetensors")

	// Loading the first file brings back the state of SaveAsync's call and its step count.
	if err := opt.Load([]string{dir + "/async.safetensors"}, nil); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := states(t, opt, params); !reflect.DeepEqual(got, before) {
		t.Errorf("Load of SaveAsync's file did not restore the state of its call")
	}
	if n, err := opt.StepCount(0); err != nil || n != 2 {
		t.Errorf("StepCount after Load = %d, %v; want 2", n, err)
	}
	if err := job.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := job2.Close(); err != nil {
		t.Errorf("Close (second job): %v", err)
	}
}

// Errors found before the write starts come back from SaveAsync, with no job and no
// temporary file left behind.
func TestSaveAsyncRefusesWithoutAJob(t *testing.T) {
	dir := t.TempDir()
	opt, _, step := asyncFixture(t, 6)
	step()
	job, err := opt.SaveAsync(dir + "/no/such/dir/state.safetensors")
	if job != nil {
		t.Errorf("SaveAsync into a missing directory returned a job")
		job.Close()
	}
	if e := asError(t, err); e.Status != StatusIO || !strings.Contains(e.Message, "no/such/dir/state.safetensors") {
		t.Errorf("SaveAsync into a missing directory: %v; want StatusIO naming the path", err)
	}
	job, err = opt.SaveAsync(dir + "/nul\x00.safetensors")
	if e := asError(t, err); job != nil || e.Status != StatusInvalidArgument {
		t.Errorf("SaveAsync of a path with a NUL byte = %v, %v; want no job, StatusInvalidArgument", job, err)
	}
	// The optimizer still saves.
	job, err = opt.SaveAsync(dir + "/ok.safetensors")
	if err != nil {
		t.Fatalf("SaveAsync after a refused one: %v", err)
	}
	if err := job.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	opt.Close()
	job, err = opt.SaveAsync(dir + "/closed.safetensors")
	if e := asError(t, err); job != nil || e.Status != StatusState || !strings.Contains(e.Message, "closed") {
		t.Errorf("SaveAsync on a closed optimizer = %v, %v; want no job, StatusState", job, err)
	}
	expectOnlyFiles(t, dir, "ok.safetensors")
}

// Wait returns the same outcome every time, Done says the job ended once Wait returned,
// and Close returns it too, twice; Done alone sees a job end. A job outlives its
// optimizer's Close, which waits for it.
func TestExportJobWaitDoneClose(t *testing.T) {
	dir := t.TempDir()
	opt, params, step := asyncFixture(t, 7)
	step()
	want := states(t, opt, params)
	job, err := opt.SaveAsync(dir + "/a.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := job.Wait(); err != nil {
			t.Fatalf("Wait #%d: %v", i+1, err)
		}
	}
	if done, err := job.Done(); !done || err != nil {
		t.Errorf("Done after Wait = %v, %v; want true, nil", done, err)
	}
	for i := 0; i < 2; i++ {
		if err := job.Close(); err != nil {
			t.Errorf("Close #%d: %v", i+1, err)
		}
	}
	if err := job.Wait(); err != nil {
		t.Errorf("Wait after Close: %v", err)
	}
	if done, err := job.Done(); !done || err != nil {
		t.Errorf("Done after Close = %v, %v; want true, nil", done, err)
	}

	// Done alone, until the job has ended.
	job, err = opt.SaveAsync(dir + "/b.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		done, err := job.Done()
		if err != nil {
			t.Fatalf("Done: %v", err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the job did not end within a minute")
		}
		time.Sleep(time.Millisecond)
	}
	if err := job.Wait(); err != nil {
		t.Errorf("Wait after Done: %v", err)
	}
	job.Close()

	// Several goroutines wait, poll and close at once while the job may be writing.
	job, err = opt.SaveAsync(dir + "/d.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			switch g {
			case 0, 1:
				errs <- job.Wait()
			case 2:
				for {
					done, err := job.Done()
					if done || err != nil {
						errs <- err
						return
					}
					time.Sleep(time.Millisecond)
				}
			case 3:
				errs <- job.Close()
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a concurrent Wait, Done or Close: %v", err)
		}
	}

	// The optimizer closed while its job may be writing: Close waits for it, the job
	// still answers, and the file is whole.
	job, err = opt.SaveAsync(dir + "/c.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	opt.Close()
	if err := job.Wait(); err != nil {
		t.Errorf("Wait after the optimizer's Close: %v", err)
	}
	if err := job.Close(); err != nil {
		t.Errorf("Close after the optimizer's Close: %v", err)
	}
	for _, name := range []string{"a", "b", "c", "d"} {
		fresh, freshParams, _ := asyncFixture(t, 8)
		if err := fresh.Load([]string{dir + "/" + name + ".safetensors"}, nil); err != nil {
			t.Fatalf("Load(%s): %v", name, err)
		}
		if got := states(t, fresh, freshParams); !reflect.DeepEqual(got, want) {
			t.Errorf("Load(%s) did not restore the saved state", name)
		}
	}
}

// A write that fails on the library's thread (the file size limit makes the writer's
// disk reservation fail) comes back from Wait, Done and Close as the job's own error;
// nothing appears at the path and the temporary file is gone.
func TestSaveAsyncReportsTheJobsFailure(t *testing.T) {
	dir := t.TempDir()
	opt, _, step := asyncFixture(t, 9)
	step()
	var limit syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &limit); err != nil {
		t.Skipf("getrlimit(RLIMIT_FSIZE): %v", err)
	}
	// Exceeding the limit also raises SIGXFSZ, on the library's thread, which Go
	// re-raises with its default action (the process ends) for a thread not its own.
	signal.Ignore(syscall.SIGXFSZ)
	defer signal.Reset(syscall.SIGXFSZ)
	small := limit
	small.Cur = 4096 // the state is 8 MiB
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &small); err != nil {
		t.Skipf("setrlimit(RLIMIT_FSIZE): %v", err)
	}
	restore := func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limit); err != nil {
			t.Fatalf("restoring RLIMIT_FSIZE: %v", err)
		}
	}
	defer restore()
	job, err := opt.SaveAsync(dir + "/state.safetensors")
	if err != nil {
		t.Fatalf("SaveAsync: %v (the failure must come from the job)", err)
	}
	waitErr := job.Wait()
	restore()
	e := asError(t, waitErr)
	if e.Status != StatusIO || !strings.Contains(e.Message, "sa_optimizer_export_async") ||
		!strings.Contains(e.Message, "make room") {
		t.Errorf("Wait = %v; want StatusIO with the job's message", waitErr)
	}
	if again := job.Wait(); !reflect.DeepEqual(again, waitErr) {
		t.Errorf("second Wait = %v, first %v", again, waitErr)
	}
	if done, err := job.Done(); !done || !reflect.DeepEqual(err, waitErr) {
		t.Errorf("Done = %v, %v; want true, %v", done, err, waitErr)
	}
	if err := job.Close(); !reflect.DeepEqual(err, waitErr) {
		t.Errorf("Close = %v; want %v", err, waitErr)
	}
	expectOnlyFiles(t, dir)
	// The optimizer saves again once the limit is gone.
	if err := opt.Save(dir + "/state.safetensors"); err != nil {
		t.Errorf("Save after the failed job: %v", err)
	}
}
