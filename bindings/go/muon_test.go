package shardadam

import (
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"sync"
	"testing"
)

// A Muon group (update_rule RuleMuon) from Go: its matrices stepped as a float64 Muon
// written here (torch.optim.Muon's update: momentum by lerp, Nesterov, the quintic
// Newton-Schulz, decoupled decay, the "original" lr adjustment), beside an AdamW group; and
// what it refuses, by name.

// ns64 orthogonalizes the rows x cols matrix g (row-major) as torch's
// _zeropower_via_newtonschulz does, in float64.
func ns64(g []float64, rows, cols int, a, b, c float64, steps int, eps float64) []float64 {
	tall := rows > cols
	m, n := rows, cols
	x := append([]float64(nil), g...)
	if tall { // work on the transpose, m x n with m <= n
		m, n = cols, rows
		for i := 0; i < rows; i++ {
			for j := 0; j < cols; j++ {
				x[j*rows+i] = g[i*cols+j]
			}
		}
	}
	norm := 0.0
	for _, v := range x {
		norm += v * v
	}
	norm = math.Max(math.Sqrt(norm), eps)
	for i := range x {
		x[i] /= norm
	}
	for s := 0; s < steps; s++ {
		gram := make([]float64, m*m) // A = X X^T
		for i := 0; i < m; i++ {
			for j := 0; j < m; j++ {
				for k := 0; k < n; k++ {
					gram[i*m+j] += x[i*n+k] * x[j*n+k]
				}
			}
		}
		poly := make([]float64, m*m) // B = b A + c A A
		for i := 0; i < m; i++ {
			for j := 0; j < m; j++ {
				sq := 0.0
				for k := 0; k < m; k++ {
					sq += gram[i*m+k] * gram[k*m+j]
				}
				poly[i*m+j] = b*gram[i*m+j] + c*sq
			}
		}
		next := make([]float64, m*n) // X = a X + B X
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				v := a * x[i*n+j]
				for k := 0; k < m; k++ {
					v += poly[i*m+k] * x[k*n+j]
				}
				next[i*n+j] = v
			}
		}
		x = next
	}
	if !tall {
		return x
	}
	out := make([]float64, rows*cols)
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			out[i*cols+j] = x[j*rows+i]
		}
	}
	return out
}

func TestMuonGroupStepsMatricesAsAFloat64Muon(t *testing.T) {
	opt := newOptimizer(t)
	adamw := mustAddGroup(t, opt, nil)
	const lr, wd, momentum, eps = 0.02, 0.1, 0.9, 1e-7
	muon := mustAddGroup(t, opt, GroupConfig{"update_rule": RuleMuon, "lr": lr, "weight_decay": wd,
		"momentum": momentum, "eps": eps})
	rng := rand.New(rand.NewSource(7))
	const rows, cols = 6, 10
	init := make([]float32, rows*cols)
	for i := range init {
		init[i] = float32(rng.NormFloat64())
	}
	w, err := opt.AddParam("w", muon, []int64{rows, cols}, init, nil)
	if err != nil {
		t.Fatalf("AddParam(w): %v", err)
	}
	bias, err := opt.AddParam("b", adamw, []int64{cols}, make([]float32, cols), nil)
	if err != nil {
		t.Fatalf("AddParam(b): %v", err)
	}
	p64, buf := make([]float64, rows*cols), make([]float64, rows*cols)
	for i, v := range init {
		p64[i] = float64(v)
	}
	for step := 0; step < 3; step++ {
		g := make([]float32, rows*cols)
		for i := range g {
			g[i] = float32(0.01 * rng.NormFloat64())
		}
		if err := opt.SetGrad(w, g); err != nil {
			t.Fatalf("SetGrad(w): %v", err)
		}
		if err := opt.SetGrad(bias, make([]float32, cols)); err != nil {
			t.Fatalf("SetGrad(b): %v", err)
		}
		if err := opt.Step(); err != nil {
			t.Fatalf("Step: %v", err)
		}
		u := make([]float64, rows*cols)
		for i := range buf {
			gi := float64(g[i])
			buf[i] += (1 - momentum) * (gi - buf[i])
			u[i] = gi + momentum*(buf[i]-gi) // Nesterov (the default)
		}
		o := ns64(u, rows, cols, 3.4445, -4.775, 2.0315, 5, eps)
		adjusted := lr * math.Sqrt(math.Max(1, float64(rows)/float64(cols)))
		for i := range p64 {
			p64[i] = p64[i]*(1-lr*wd) - adjusted*o[i]
		}
	}
	worst, moved := 0.0, 0.0
	for i, v := range w.Float32() {
		worst = math.Max(worst, math.Abs(float64(v)-p64[i]))
		moved = math.Max(moved, math.Abs(p64[i]-float64(init[i])))
	}
	if worst > 2e-5 || moved < 0.01 {
		t.Errorf("after 3 steps: largest error %g (want < 2e-5), largest move %g (want > 0.01)", worst, moved)
	}
	mb, err := opt.State(w, "momentum_buffer")
	if err != nil {
		t.Fatalf("State(momentum_buffer): %v", err)
	}
	for i, v := range mb {
		if math.Abs(float64(v)-buf[i]) > 1e-7 {
			t.Fatalf("momentum_buffer[%d] = %g, want %g", i, v, buf[i])
		}
	}
}

func TestMuonRefusesWhatItCannotStepByName(t *testing.T) {
	opt := newOptimizer(t)
	muon := mustAddGroup(t, opt, GroupConfig{"update_rule": RuleMuon})
	_, err := opt.AddParam("norm", muon, []int64{8}, make([]float32, 8), nil)
	expectError(t, "AddParam(a 1-D param)", err, StatusInvalidArgument, "param 'norm'", "2-D", "AdamW group")
	_, err = opt.AddGroup(GroupConfig{"update_rule": RuleMuon, "amsgrad": 1})
	expectError(t, "AddGroup(Muon with amsgrad)", err, StatusInvalidArgument, "amsgrad", "SA_RULE_MUON")
}

// exchangeGroup is an all-to-all (and an all-reduce) among commRanks goroutines, counting
// the all-to-all calls: each rank deposits its blocks, waits for all, then takes its own.
type exchangeGroup struct {
	threads  *threadGroup
	mu       sync.Mutex
	barrier  *sync.Cond
	arrived  int
	round    int
	deposits [][]byte
	sizes    [][]int64
	calls    int
}

// wait blocks until every rank has called it once more.
func (g *exchangeGroup) wait() {
	if g.arrived++; g.arrived < commRanks {
		for round := g.round; round == g.round; {
			g.barrier.Wait()
		}
		return
	}
	g.arrived = 0
	g.round++
	g.barrier.Broadcast()
}

func (g *exchangeGroup) allToAll(rank int) AllToAll {
	return func(send []byte, sendBytes []int64, recv []byte, recvBytes []int64) error {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.calls++
		g.deposits[rank], g.sizes[rank] = append([]byte(nil), send...), append([]int64(nil), sendBytes...)
		g.wait()
		at := 0
		for sender := 0; sender < commRanks; sender++ {
			start := int64(0)
			for r := 0; r < rank; r++ {
				start += g.sizes[sender][r]
			}
			if g.sizes[sender][rank] != recvBytes[sender] {
				return fmt.Errorf("rank %d sends %d bytes to rank %d, which expects %d", sender,
					g.sizes[sender][rank], rank, recvBytes[sender])
			}
			at += copy(recv[at:], g.deposits[sender][start:start+recvBytes[sender]])
		}
		g.wait() // nobody deposits again before everyone has taken its blocks
		return nil
	}
}

func TestSplitMuonMatricesStepThroughAnAllToAllAsOneRankDoes(t *testing.T) {
	// A 7 x 5 matrix in rows (3, 3, 1) and a 4 x 6 one in columns (2, 2, 2) over 3 goroutine
	// ranks whose AllToAll carries the parts to their owners and back: each rank's boxes equal
	// one rank's whole matrices after 3 steps, bit for bit.
	type matrix struct {
		rows, cols int64
		placement  Placement
	}
	matrices := []matrix{{7, 5, Shard(0)}, {4, 6, Shard(1)}}
	muonConfig := GroupConfig{"update_rule": RuleMuon, "lr": 0.02}
	rng := rand.New(rand.NewSource(11))
	start, grads := make([][]float32, len(matrices)), make([][][]float32, 3)
	for i, m := range matrices {
		start[i] = make([]float32, m.rows*m.cols)
		for k := range start[i] {
			start[i][k] = float32(rng.NormFloat64())
		}
	}
	for s := range grads {
		grads[s] = make([][]float32, len(matrices))
		for i, m := range matrices {
			grads[s][i] = make([]float32, m.rows*m.cols)
			for k := range grads[s][i] {
				grads[s][i][k] = float32(0.01 * rng.NormFloat64())
			}
		}
	}
	// box returns rows [r0, r0+nr) x columns [c0, c0+nc) of a row-major matrix of cols columns.
	box := func(m []float32, cols, r0, c0, nr, nc int64) []float32 {
		out := make([]float32, 0, nr*nc)
		for r := r0; r < r0+nr; r++ {
			out = append(out, m[r*cols+c0:r*cols+c0+nc]...)
		}
		return out
	}
	whole := newOptimizer(t)
	g := mustAddGroup(t, whole, muonConfig)
	wholeParams := make([]*Param, len(matrices))
	for i, m := range matrices {
		p, err := whole.AddParam(fmt.Sprintf("m%d", i), g, []int64{m.rows, m.cols}, start[i], nil)
		if err != nil {
			t.Fatal(err)
		}
		wholeParams[i] = p
	}
	for s := range grads {
		for i, p := range wholeParams {
			if err := whole.SetGrad(p, grads[s][i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := whole.Step(); err != nil {
			t.Fatal(err)
		}
	}

	group := &exchangeGroup{threads: newThreadGroup(), deposits: make([][]byte, commRanks),
		sizes: make([][]int64, commRanks)}
	group.barrier = sync.NewCond(&group.mu)
	errs := make([]error, commRanks)
	var wg sync.WaitGroup
	for rank := 0; rank < commRanks; rank++ {
		wg.Add(1)
		go func(rank int) {
			defer wg.Done()
			errs[rank] = func() error {
				comm, err := NewExchangingHostComm(rank, commRanks, func(values []float64, op ReduceOp) error {
					group.threads.allReduce(rank, values, op)
					return nil
				}, group.allToAll(rank))
				if err != nil {
					return err
				}
				defer comm.Close()
				opt, err := NewOptimizer(&Config{NumThreads: 1})
				if err != nil {
					return err
				}
				defer opt.Close()
				if err := opt.SetComm(comm); err != nil {
					return err
				}
				grp, err := opt.AddGroup(muonConfig)
				if err != nil {
					return err
				}
				params, boxes := make([]*Param, len(matrices)), make([][4]int64, len(matrices))
				for i, m := range matrices {
					r0, c0, nr, nc := int64(0), int64(0), m.rows, m.cols
					if m.placement == Shard(0) {
						r0, nr = 3*int64(rank), m.rows-3*int64(rank)
						if nr > 3 {
							nr = 3
						}
					} else {
						c0, nc = 2*int64(rank), 2
					}
					boxes[i] = [4]int64{r0, c0, nr, nc}
					layout := &Layout{GlobalShape: []int64{m.rows, m.cols}, MeshShape: []int64{commRanks},
						MeshCoord: []int64{int64(rank)}, Placements: []Placement{m.placement}}
					p, err := opt.AddParam(fmt.Sprintf("m%d", i), grp, []int64{nr, nc},
						box(start[i], m.cols, r0, c0, nr, nc), &ParamOptions{Layout: layout})
					if err != nil {
						return err
					}
					params[i] = p
				}
				for s := range grads {
					for i, p := range params {
						b := boxes[i]
						if err := opt.SetGrad(p, box(grads[s][i], matrices[i].cols, b[0], b[1], b[2], b[3])); err != nil {
							return err
						}
					}
					if err := opt.Step(); err != nil {
						return err
					}
				}
				for i, p := range params {
					b := boxes[i]
					want := box(wholeParams[i].Float32(), matrices[i].cols, b[0], b[1], b[2], b[3])
					if got := p.Float32(); !reflect.DeepEqual(got, want) {
						return fmt.Errorf("matrix %d: rank %d's box %v differs from the whole matrix's", i, rank, b)
					}
				}
				return nil
			}()
		}(rank)
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", rank, err)
		}
	}
	if group.calls == 0 {
		t.Error("AllToAll was never called")
	}
	if _, err := NewExchangingHostComm(0, 2, func([]float64, ReduceOp) error { return nil }, nil); err == nil {
		t.Error("NewExchangingHostComm with a nil AllToAll was accepted")
	}
}
