package shardadam

// Global grad-norm clipping and the found-inf consensus across ranks, through host
// communicators: three ranks run as goroutines, each with its own optimizer over its
// shards (uneven row splits, an empty shard, a param replicated on every rank), and
// all-reduce through Go functions. The norm and the clipped steps are checked against a
// float64 reference on the full tensors.

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"strings"
	"sync"
	"testing"
)

const commRanks = 3

// ---- an all-reduce among goroutines ----------------------------------------------------

// threadGroup is an all-reduce among commRanks goroutines. Each rank deposits its values;
// the last to arrive combines them in rank order (so every rank gets the same bits) and
// wakes the others.
type threadGroup struct {
	mu       sync.Mutex
	done     *sync.Cond
	deposits [][]float64
	result   []float64
	arrived  int
	round    int
	calls    int
	ops      []ReduceOp
}

func newThreadGroup() *threadGroup {
	g := &threadGroup{deposits: make([][]float64, commRanks)}
	g.done = sync.NewCond(&g.mu)
	return g
}

func (g *threadGroup) allReduce(rank int, values []float64, op ReduceOp) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	g.ops = append(g.ops, op)
	g.deposits[rank] = append([]float64(nil), values...)
	if g.arrived++; g.arrived < commRanks {
		for round := g.round; round == g.round; {
			g.done.Wait()
		}
	} else {
		g.result = append([]float64(nil), g.deposits[0]...)
		for _, d := range g.deposits[1:] {
			for i, x := range d {
				switch {
				case op == ReduceSum:
					g.result[i] += x
				case math.IsNaN(x) || math.IsNaN(g.result[i]): // NaN wins, as it must
					g.result[i] = math.NaN()
				default:
					g.result[i] = math.Max(g.result[i], x)
				}
			}
		}
		g.arrived = 0
		g.round++
		g.done.Broadcast()
	}
	copy(values, g.result)
}

// comm returns rank `rank`'s communicator.
func (g *threadGroup) comm(t *testing.T, rank int) *Comm {
	t.Helper()
	c, err := NewHostComm(func(values []float64, op ReduceOp) error {
		g.allReduce(rank, values, op)
		return nil
	})
	if err != nil {
		t.Fatalf("NewHostComm: %v", err)
	}
	return c
}

// ---- the problem ---------------------------------------------------------------------------

// commSpec is a param of the global model and how the 3-rank mesh places it.
type commSpec struct {
	name        string
	globalShape []int64
	placement   Placement
}

var commSpecs = []commSpec{
	{"w", []int64{7, 5}, Shard(0)},    // 7 rows over 3: 3, 3, 1
	{"e", []int64{2, 3}, Shard(0)},    // 2 rows over 3: 1, 1, 0 (rank 2 holds an empty shard)
	{"bias", []int64{4}, Replicate()}, // on every rank in full: counted once in the norm
}

// Adam is nearly blind to a grad scale that stays the same every step, so each step's
// grads are scaled differently: clipping then changes the update for real.
var commStepScales = []float32{1, 8, 0.5}

// commProblem holds the full tensors: initial values and each step's grads, per param.
type commProblem struct {
	init  [][]float32
	grads [][][]float32 // [step][param]
}

func newCommProblem() *commProblem {
	rng := rand.New(rand.NewSource(2024))
	p := &commProblem{}
	for _, s := range commSpecs {
		p.init = append(p.init, randomValues(rng, product(s.globalShape)))
	}
	for _, scale := range commStepScales {
		var grads [][]float32
		for _, s := range commSpecs {
			g := randomValues(rng, product(s.globalShape))
			for i := range g {
				g[i] *= scale
			}
			grads = append(grads, g)
		}
		p.grads = append(p.grads, grads)
	}
	return p
}

// boxOf returns the box [offset, offset + local) of a row-major global tensor.
func boxOf(global []float32, globalShape, local, offset []int64) []float32 {
	out := make([]float32, product(local))
	for flat := range out {
		at, stride, rest := int64(0), int64(1), int64(flat)
		for d := len(local) - 1; d >= 0; d-- {
			at += (rest%local[d] + offset[d]) * stride
			rest /= local[d]
			stride *= globalShape[d]
		}
		out[flat] = global[at]
	}
	return out
}

// referenceNorm is the L2 or inf norm of one step's full grads, every element once.
func referenceNorm(grads [][]float32, normType NormType) float64 {
	sum, max := 0.0, 0.0
	for _, g := range grads {
		for _, x := range g {
			sum += float64(x) * float64(x)
			max = math.Max(max, math.Abs(float64(x)))
		}
	}
	if normType == NormInf {
		return max
	}
	return math.Sqrt(sum)
}

// clipCoefficient is torch.nn.utils.clip_grad_norm_'s.
func clipCoefficient(norm, maxNorm float64) float64 {
	return math.Min(1, maxNorm/(norm+1e-6))
}

func commHP() GroupConfig {
	hp := DefaultGroupConfig()
	hp["lr"] = 1e-2
	return hp
}

// commRank is one rank: its optimizer and, per param, its box in the global tensor.
type commRank struct {
	rank           int
	opt            *Optimizer
	params         []*Param
	local, offsets [][]int64
}

func newCommRank(t *testing.T, rank int, comm *Comm, p *commProblem) *commRank {
	t.Helper()
	opt, err := NewOptimizer(&Config{NumThreads: 1})
	if err != nil {
		t.Fatalf("NewOptimizer: %v", err)
	}
	t.Cleanup(func() { opt.Close() })
	mustAddGroup(t, opt, commHP())
	r := &commRank{rank: rank, opt: opt}
	for k, s := range commSpecs {
		layout := Layout{GlobalShape: s.globalShape, MeshShape: []int64{commRanks},
			MeshCoord: []int64{int64(rank)}, Placements: []Placement{s.placement}}
		local, offset, err := LocalBox(layout)
		if err != nil {
			t.Fatalf("LocalBox: %v", err)
		}
		param, err := opt.AddParam(s.name, 0, local, boxOf(p.init[k], s.globalShape, local, offset),
			&ParamOptions{Layout: &layout})
		if err != nil {
			t.Fatalf("AddParam(%s): %v", s.name, err)
		}
		r.params = append(r.params, param)
		r.local = append(r.local, local)
		r.offsets = append(r.offsets, offset)
	}
	if err := opt.SetComm(comm); err != nil {
		t.Fatalf("SetComm: %v", err)
	}
	return r
}

// loadGrads binds this rank's boxes of a step's global grads; poison, if not nil, is
// applied to each param's box first.
func (r *commRank) loadGrads(grads [][]float32, poison func(k int, grad []float32)) error {
	for k, s := range commSpecs {
		grad := boxOf(grads[k], s.globalShape, r.local[k], r.offsets[k])
		if poison != nil {
			poison(k, grad)
		}
		if err := r.opt.SetGrad(r.params[k], grad); err != nil {
			return err
		}
	}
	return nil
}

func (r *commRank) values() [][]float32 {
	var out [][]float32
	for _, p := range r.params {
		out = append(out, append([]float32(nil), p.Float32()...))
	}
	return out
}

// newCommWorld makes the ranks with their communicators (closed at once: each optimizer
// keeps its own alive).
func newCommWorld(t *testing.T, p *commProblem) (*threadGroup, []*commRank) {
	group := newThreadGroup()
	var ranks []*commRank
	for r := 0; r < commRanks; r++ {
		comm := group.comm(t, r)
		ranks = append(ranks, newCommRank(t, r, comm, p))
		comm.Close()
	}
	return group, ranks
}

// onAllRanks runs f on every rank at once, each in its own goroutine (the all-reduce needs
// them all), and returns the reports; any error fails the test.
func onAllRanks(t *testing.T, ranks []*commRank, f func(r *commRank) (StepReport, error)) []StepReport {
	t.Helper()
	reports := make([]StepReport, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Add(1)
		go func(i int, r *commRank) {
			defer wg.Done()
			reports[i], errs[i] = f(r)
		}(i, r)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	return reports
}

// clippedStep loads step s's grads and steps with the given bound and norm.
func clippedStep(p *commProblem, s int, bound float64, normType NormType) func(r *commRank) (StepReport, error) {
	return func(r *commRank) (StepReport, error) {
		if err := r.loadGrads(p.grads[s], nil); err != nil {
			return StepReport{}, err
		}
		return r.opt.StepWith(StepArgs{MaxGradNorm: bound, NormType: normType})
	}
}

// expectRanksMatch checks every rank's boxes against the reference's full tensors.
func expectRanksMatch(t *testing.T, what string, ranks []*commRank, refs []*refState) {
	t.Helper()
	for _, r := range ranks {
		for k, s := range commSpecs {
			want32 := make([]float32, len(refs[k].p))
			for i, x := range refs[k].p {
				want32[i] = float32(x) // within the tolerance: half an ulp
			}
			box := boxOf(want32, s.globalShape, r.local[k], r.offsets[k])
			want := make([]float64, len(box))
			for i, x := range box {
				want[i] = float64(x)
			}
			expectClose(t, fmt.Sprintf("%s: rank %d param '%s'", what, r.rank, s.name),
				r.params[k].Float32(), want)
		}
	}
}

// ---- specifications ----------------------------------------------------------------------

func TestTheCommProblemClipsItsNormsAreWellAboveTheBounds(t *testing.T) {
	// Otherwise the clipping tests would pass with clipping switched off.
	for s, grads := range newCommProblem().grads {
		if n := referenceNorm(grads, NormL2); n <= 1.5 {
			t.Errorf("step %d: L2 norm %g", s, n)
		}
		if n := referenceNorm(grads, NormInf); n <= 0.4 {
			t.Errorf("step %d: inf norm %g", s, n)
		}
	}
}

func TestThreeRanksAgreeOnTheGlobalL2NormAndClipLikeAFloat64Reference(t *testing.T) {
	p := newCommProblem()
	group, ranks := newCommWorld(t, p)
	const bound = 1.0
	var clipped, unclipped []*refState
	for _, init := range p.init {
		clipped = append(clipped, newRefState(init))
		unclipped = append(unclipped, newRefState(init))
	}
	for s, grads := range p.grads {
		reports := onAllRanks(t, ranks, clippedStep(p, s, bound, NormL2))
		want := referenceNorm(grads, NormL2)
		for r, report := range reports {
			if report.Skipped {
				t.Fatalf("step %d rank %d skipped", s, r)
			}
			// Each element once: counting the 3 copies of 'bias' would be off by far more.
			if math.Abs(report.GradNorm-want) > 1e-12*want {
				t.Fatalf("step %d rank %d: norm %.17g, float64 reference %.17g", s, r, report.GradNorm, want)
			}
			if math.Float64bits(report.GradNorm) != math.Float64bits(reports[0].GradNorm) {
				t.Fatalf("step %d: rank %d's norm %v differs from rank 0's %v", s, r, report.GradNorm, reports[0].GradNorm)
			}
		}
		coefficient := clipCoefficient(want, bound)
		if coefficient > 0.7 {
			t.Fatalf("step %d does not clip (coefficient %g)", s, coefficient)
		}
		for k := range clipped {
			clipped[k].step(grads[k], commHP(), s+1, coefficient)
			unclipped[k].step(grads[k], commHP(), s+1, 1)
		}
	}
	if want := commRanks * len(commStepScales); group.calls != want {
		t.Fatalf("%d all-reduce calls, want %d", group.calls, want)
	}
	for _, op := range group.ops {
		if op != ReduceSum {
			t.Fatalf("an L2 norm reduced with %v", op)
		}
	}
	for _, r := range ranks {
		if n, err := r.opt.StepCount(0); err != nil || n != int64(len(commStepScales)) {
			t.Fatalf("rank %d: step count %d, %v", r.rank, n, err)
		}
	}
	expectRanksMatch(t, "clipped", ranks, clipped)

	// Clipping changed the result: the unclipped reference is far outside the tolerance.
	farthest := 0.0
	for k, values := range ranks[0].values() {
		for i, x := range values {
			farthest = math.Max(farthest, math.Abs(float64(x)-unclipped[k].p[i]))
		}
	}
	if farthest <= 1e-3 {
		t.Fatalf("the clipped run ends within %g of the unclipped reference", farthest)
	}
}

func TestTheInfNormReducesWithMaxAndClipsLikeTheReference(t *testing.T) {
	p := newCommProblem()
	group, ranks := newCommWorld(t, p)
	const bound = 0.25
	var refs []*refState
	for _, init := range p.init {
		refs = append(refs, newRefState(init))
	}
	for s, grads := range p.grads {
		reports := onAllRanks(t, ranks, clippedStep(p, s, bound, NormInf))
		want := referenceNorm(grads, NormInf)
		for r, report := range reports {
			if report.GradNorm != want { // a max is exact
				t.Fatalf("step %d rank %d: norm %v, want %v", s, r, report.GradNorm, want)
			}
		}
		for k := range refs {
			refs[k].step(grads[k], commHP(), s+1, clipCoefficient(want, bound))
		}
	}
	for _, op := range group.ops {
		if op != ReduceMax {
			t.Fatalf("an inf norm reduced with %v", op)
		}
	}
	expectRanksMatch(t, "inf-clipped", ranks, refs)
}

func TestANaNGradOrFoundInfOnOneRankSkipsTheStepOnAllRanks(t *testing.T) {
	p := newCommProblem()
	group, ranks := newCommWorld(t, p)
	onAllRanks(t, ranks, clippedStep(p, 0, 1, NormL2))
	var before [][][]float32
	for _, r := range ranks {
		before = append(before, r.values())
	}

	// A NaN in rank 1's shard of 'w'.
	reports := onAllRanks(t, ranks, func(r *commRank) (StepReport, error) {
		err := r.loadGrads(p.grads[1], func(k int, grad []float32) {
			if r.rank == 1 && k == 0 {
				grad[4] = float32(math.NaN())
			}
		})
		if err != nil {
			return StepReport{}, err
		}
		return r.opt.StepWith(StepArgs{MaxGradNorm: 1})
	})
	for r, report := range reports {
		if !report.Skipped || !math.IsNaN(report.GradNorm) {
			t.Fatalf("rank %d: %+v, want skipped with a NaN norm", r, report)
		}
	}

	// FoundInf on rank 2 alone, no norm: a found-inf consensus only.
	reports = onAllRanks(t, ranks, func(r *commRank) (StepReport, error) {
		return r.opt.StepWith(StepArgs{FoundInf: r.rank == 2, ReduceFoundInf: true})
	})
	for r, report := range reports {
		if report != (StepReport{Skipped: true}) {
			t.Fatalf("rank %d: %+v, want skipped", r, report)
		}
	}

	for i, r := range ranks {
		if after := r.values(); !reflect.DeepEqual(after, before[i]) {
			t.Fatalf("rank %d: a skipped step changed a param", r.rank)
		}
		if n, _ := r.opt.StepCount(0); n != 1 {
			t.Fatalf("rank %d: step count %d, want 1", r.rank, n)
		}
	}
	if group.calls != 3*commRanks {
		t.Fatalf("%d all-reduce calls, want %d", group.calls, 3*commRanks)
	}
}

// oneParam returns an optimizer of one float32 param of 8 elements, its grad bound (all 3),
// communicating through c.
func oneParam(t *testing.T, c *Comm) (*Optimizer, *Param) {
	t.Helper()
	opt := newOptimizer(t)
	mustAddGroup(t, opt, commHP())
	p, err := opt.AddParam("p", 0, []int64{8}, []float32{0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5}, nil)
	if err != nil {
		t.Fatalf("AddParam: %v", err)
	}
	if err := opt.SetGrad(p, []float32{3, 3, 3, 3, 3, 3, 3, 3}); err != nil {
		t.Fatalf("SetGrad: %v", err)
	}
	if err := opt.SetComm(c); err != nil {
		t.Fatalf("SetComm: %v", err)
	}
	return opt, p
}

func TestAFailingFunctionFailsTheStepWithStatusCommAndChangesNothing(t *testing.T) {
	calls := 0
	c, err := NewHostComm(func([]float64, ReduceOp) error {
		calls++
		return errors.New("the transport is down")
	})
	if err != nil {
		t.Fatalf("NewHostComm: %v", err)
	}
	defer c.Close()
	opt, p := oneParam(t, c)
	before := append([]float32(nil), p.Float32()...)
	_, err = opt.StepWith(StepArgs{MaxGradNorm: 1})
	e := asError(t, err)
	if e.Status != StatusComm || !strings.Contains(e.Message, "all_reduce") ||
		!strings.Contains(e.Message, "the transport is down") {
		t.Fatalf("got %v, want StatusComm naming all_reduce and the function's error", e)
	}
	if calls != 1 || !reflect.DeepEqual(p.Float32(), before) {
		t.Fatalf("%d calls, param %v (was %v)", calls, p.Float32(), before)
	}
	if n, _ := opt.StepCount(0); n != 0 {
		t.Fatalf("a failed step advanced the step count to %d", n)
	}

	// A step with neither a norm nor a found-inf flag does not communicate.
	if err := opt.Step(); err != nil {
		t.Fatalf("Step: %v", err)
	}
	if n, _ := opt.StepCount(0); calls != 1 || n != 1 {
		t.Fatalf("%d calls, step count %d; want 1, 1", calls, n)
	}
}

func TestAPanickingFunctionFailsTheStepInsteadOfUnwindingIntoC(t *testing.T) {
	c, err := NewHostComm(func([]float64, ReduceOp) error { panic("the function gave up") })
	if err != nil {
		t.Fatalf("NewHostComm: %v", err)
	}
	defer c.Close()
	opt, p := oneParam(t, c)
	before := append([]float32(nil), p.Float32()...)
	for i := 0; i < 2; i++ { // twice: the first panic left everything usable
		_, err := opt.StepWith(StepArgs{MaxGradNorm: 1})
		if e := asError(t, err); e.Status != StatusComm || !strings.Contains(e.Message, "panicked: the function gave up") {
			t.Fatalf("got %v, want StatusComm naming the panic", e)
		}
	}
	if !reflect.DeepEqual(p.Float32(), before) {
		t.Fatalf("a failed step changed the param")
	}
}

func TestTheOptimizerKeepsTheFunctionUntilItLetsGoOfTheCommunicator(t *testing.T) {
	calls := 0
	c, err := NewHostComm(func(values []float64, op ReduceOp) error {
		calls++
		if len(values) != 2 || op != ReduceSum {
			return errors.New("unexpected arguments")
		}
		return nil // a single rank: the reduction over all ranks is the values themselves
	})
	if err != nil {
		t.Fatalf("NewHostComm: %v", err)
	}
	if rank, nranks, err := c.RankAndSize(); err != nil || rank != -1 || nranks != -1 {
		t.Fatalf("RankAndSize of a host communicator = %d, %d, %v; want -1, -1", rank, nranks, err)
	}
	opt, _ := oneParam(t, c)
	c.Close()
	c.Close() // a no-op
	if err := opt.SetComm(c); asError(t, err).Status != StatusState {
		t.Fatalf("SetComm(closed) = %v, want StatusState", err)
	}
	// Still there: the optimizer holds its own reference.
	report, err := opt.StepWith(StepArgs{MaxGradNorm: math.Inf(1)})
	if err != nil || report.GradNorm != math.Sqrt(72) || calls != 1 {
		t.Fatalf("StepWith = %+v, %v after %d calls; want the norm sqrt(72), measured", report, err, calls)
	}
	if err := opt.SetComm(nil); err != nil {
		t.Fatalf("SetComm(nil): %v", err)
	}
	if _, err := opt.StepWith(StepArgs{MaxGradNorm: 1}); err != nil || calls != 1 {
		t.Fatalf("a step without a communicator: %v, %d calls", err, calls)
	}
}

func TestBadBoundsAreRefusedByTheLibraryBeforeAnythingChanges(t *testing.T) {
	c, err := NewHostComm(func([]float64, ReduceOp) error { return nil })
	if err != nil {
		t.Fatalf("NewHostComm: %v", err)
	}
	defer c.Close()
	opt, p := oneParam(t, c)
	before := append([]float32(nil), p.Float32()...)
	for _, bound := range []float64{-1, math.NaN()} {
		_, err := opt.StepWith(StepArgs{MaxGradNorm: bound})
		if e := asError(t, err); e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "max_grad_norm") {
			t.Fatalf("MaxGradNorm %v: got %v", bound, e)
		}
	}
	if _, err := NewHostComm(nil); asError(t, err).Status != StatusInvalidArgument {
		t.Fatalf("NewHostComm(nil) = %v", err)
	}
	if !reflect.DeepEqual(p.Float32(), before) {
		t.Fatalf("a refused step changed the param")
	}
}

func TestNCCLCommunicatorsCheckTheirArgumentsOrNeedALibraryBuiltWithNCCL(t *testing.T) {
	if !strings.Contains(BuildInfo(), "nccl: built") {
		if _, err := NewNCCLUniqueID(); asError(t, err).Status != StatusUnsupported {
			t.Fatalf("NewNCCLUniqueID = %v, want StatusUnsupported", err)
		}
		if _, err := NewNCCLComm(NCCLUniqueID{}, 1, 0, 0); asError(t, err).Status != StatusUnsupported {
			t.Fatalf("NewNCCLComm = %v, want StatusUnsupported", err)
		}
		return
	}
	// With NCCL, creating a communicator needs a GPU per rank (tested in C++); bad
	// arguments are refused before NCCL is called.
	_, err := NewNCCLComm(NCCLUniqueID{}, 0, 0, 0)
	if e := asError(t, err); e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "nranks is 0") {
		t.Fatalf("NewNCCLComm(nranks 0) = %v", e)
	}
	_, err = NewNCCLComm(NCCLUniqueID{}, 2, 2, 0)
	if e := asError(t, err); e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "rank is 2") {
		t.Fatalf("NewNCCLComm(rank 2 of 2) = %v", e)
	}
	if _, err := WrapNCCLComm(nil); asError(t, err).Status != StatusInvalidArgument {
		t.Fatalf("WrapNCCLComm(nil) = %v", err)
	}
}

func TestRankedHostCommSaysItsRankAndRefusesOneOutOfRange(t *testing.T) {
	noop := func([]float64, ReduceOp) error { return nil }
	comm, err := NewRankedHostComm(1, 3, noop)
	if err != nil {
		t.Fatal(err)
	}
	defer comm.Close()
	if rank, nranks, err := comm.RankAndSize(); err != nil || rank != 1 || nranks != 3 {
		t.Fatalf("RankAndSize = %d, %d, %v; want 1, 3", rank, nranks, err)
	}
	for _, c := range [][2]int{{3, 3}, {-1, 2}, {1, 0}} {
		_, err := NewRankedHostComm(c[0], c[1], noop)
		var e *Error
		if !errors.As(err, &e) || e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "0 <= rank < nranks") {
			t.Errorf("NewRankedHostComm(%d, %d): %v; want InvalidArgument naming 0 <= rank < nranks", c[0], c[1], err)
		}
	}
}
