package shardadam

import (
	"math"
	"math/rand"
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
