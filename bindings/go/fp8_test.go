package shardadam

import (
	"math"
	"math/rand"
	"testing"
)

// fp8 params from Go, against references written here from the formats' definitions: an
// fp8 value by its bit fields, the saturating round-to-nearest-even cast by searching every
// code, the MX scale exponent by Frexp; the master against a float32 param stepped on the
// same grads by a second optimizer.

type fp8Format struct {
	dtype      DType
	expBits    int
	manBits    int
	bias       int
	ieeeInfNaN bool // e5m2: the top exponent is inf/NaN; e4m3fn: only S.1111.111 is NaN
	emax       int  // exponent of the largest power of two
}

var (
	e4m3 = fp8Format{Float8E4M3FN, 4, 3, 7, false, 8}
	e5m2 = fp8Format{Float8E5M2, 5, 2, 15, true, 15}
)

// value is code's value; NaN for NaN codes, ±Inf for e5m2's infinities.
func (f fp8Format) value(code uint8) float64 {
	sign := 1.0
	if code&0x80 != 0 {
		sign = -1
	}
	e := int(code>>f.manBits) & (1<<f.expBits - 1)
	m := int(code) & (1<<f.manBits - 1)
	top := 1<<f.expBits - 1
	switch {
	case f.ieeeInfNaN && e == top && m == 0:
		return math.Inf(int(sign))
	case f.ieeeInfNaN && e == top, !f.ieeeInfNaN && e == top && m == 1<<f.manBits-1:
		return math.NaN()
	case e == 0:
		return sign * math.Ldexp(float64(m), 1-f.bias-f.manBits)
	}
	return sign * math.Ldexp(float64(m|1<<f.manBits), e-f.bias-f.manBits)
}

func (f fp8Format) largest() float64 {
	best := 0.0
	for c := 0; c < 128; c++ {
		if v := f.value(uint8(c)); !math.IsInf(v, 0) && !math.IsNaN(v) && v > best {
			best = v
		}
	}
	return best
}

// cast is the saturating round-to-nearest-even cast of x (a NaN gives a NaN code).
func (f fp8Format) cast(x float32) uint8 {
	v := float64(x)
	if math.IsNaN(v) {
		return 0x7f
	}
	if max := f.largest(); math.Abs(v) > max {
		v = math.Copysign(max, v)
	}
	best, bestDiff := -1, math.Inf(1)
	for c := 0; c < 256; c++ {
		cv := f.value(uint8(c))
		if math.IsNaN(cv) || math.IsInf(cv, 0) || (cv == 0 && math.Signbit(cv) != math.Signbit(v)) {
			continue
		}
		d := math.Abs(cv - v)
		if d < bestDiff || (d == bestDiff && c&1 == 0) {
			best, bestDiff = c, d
		}
	}
	return uint8(best)
}

func TestParamScalingsAreTheHeadersTable(t *testing.T) {
	want := map[string]struct {
		value  Scaling
		block  int64
		dtype  DType
		writes bool
	}{
		"none":         {ScalingNone, 0, Float32, false},
		"delayed":      {ScalingDelayed, 0, Float32, false},
		"mxfp8":        {ScalingMXFP8, 32, Float8E8M0FNU, true},
		"block128":     {ScalingBlock128, 128, Float32, true},
		"current":      {ScalingCurrent, 0, Float32, true},
		"current_pow2": {ScalingCurrentPow2, 0, Float32, true},
	}
	got := ParamScalings()
	if len(got) != len(want) {
		t.Fatalf("ParamScalings has %d entries, want %d: %+v", len(got), len(want), got)
	}
	for _, s := range got {
		w, ok := want[s.Name]
		if !ok || s.Value != w.value || s.Block != w.block || s.ScaleDType != w.dtype || s.StepWritesScale != w.writes || s.Doc == "" {
			t.Errorf("scaling %+v, want %+v", s, w)
		}
	}
}

// newHost allocates a host tensor, freed when the test ends (after the optimizers close:
// cleanups run last-registered first).
func newHost(t *testing.T, dtype DType, shape ...int64) *HostTensor {
	t.Helper()
	h, err := NewHostTensor(dtype, shape)
	if err != nil {
		t.Fatalf("NewHostTensor: %v", err)
	}
	t.Cleanup(h.Free)
	return h
}

// unitCurrentScale is a current scaling's [scale, scale_inv] tensor, both 1 (freed at the
// test's end).
func unitCurrentScale(t *testing.T) Tensor {
	t.Helper()
	s := newHost(t, Float32, 2)
	s.Float32()[0], s.Float32()[1] = 1, 1
	return s.Tensor()
}

// An fp8 param under delayed scaling (e4m3fn) and MXFP8 (e5m2): over several steps its
// master is the float32 twin's param bit for bit, its codes the reference cast of the
// master, its amax / block scales the reference rule's.
func TestFP8ParamsStepTheirMasterAndCastIt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		f       fp8Format
		scaling Scaling
	}{{"delayed e4m3fn", e4m3, ScalingDelayed}, {"mxfp8 e5m2", e5m2, ScalingMXFP8}} {
		t.Run(tc.name, func(t *testing.T) {
			const rows, cols = 4, 64
			rng := rand.New(rand.NewSource(7))
			param := newHost(t, tc.f.dtype, rows, cols)
			codes := param.Bytes()
			for i := range codes {
				codes[i] = tc.f.cast(float32(rng.NormFloat64() * 20))
			}
			opts := &ParamOptions{Scaling: tc.scaling}
			var scale, amax *HostTensor
			start := make([]float32, len(codes))
			if tc.scaling == ScalingDelayed {
				scale, amax = newHost(t, Float32, 1), newHost(t, Float32, 1)
				scale.Float32()[0] = 0.75
				for i, c := range codes {
					start[i] = float32(tc.f.value(c)) / 0.75
				}
				st, at := scale.Tensor(), amax.Tensor()
				opts.Scale, opts.Amax = &st, &at
			} else {
				scale = newHost(t, Float8E8M0FNU, rows, cols/32)
				for b := range scale.Bytes() {
					code := uint8(120 + b%9) // X = 2^(code - 127): 2^-7 .. 2^1
					scale.Bytes()[b] = code
					for i := b * 32; i < (b+1)*32; i++ {
						start[i] = float32(tc.f.value(codes[i])) * float32(math.Ldexp(1, int(code)-127))
					}
				}
				st := scale.Tensor()
				opts.Scale = &st
			}
			opt, twin := newOptimizer(t), newOptimizer(t)
			hp := GroupConfig{"lr": 1e-2, "weight_decay": 0.05}
			mustAddGroup(t, opt, hp)
			mustAddGroup(t, twin, hp)
			p, err := opt.AddParamTensor("w", 0, param.Tensor(), opts)
			if err != nil {
				t.Fatalf("AddParamTensor: %v", err)
			}
			if p.GradDType != Float32 {
				t.Errorf("GradDType %s, want float32 (the library's default for fp8 params)", p.GradDType)
			}
			q, err := twin.AddParam("w", 0, []int64{rows, cols}, start, nil)
			if err != nil {
				t.Fatalf("twin AddParam: %v", err)
			}
			grad := newHost(t, Float32, rows, cols)
			if err := opt.BindGrad(p, grad.Tensor()); err != nil {
				t.Fatalf("BindGrad: %v", err)
			}
			for step := 1; step <= 3; step++ {
				for i := range grad.Float32() {
					grad.Float32()[i] = float32(rng.NormFloat64() * 3)
				}
				if err := twin.SetGrad(q, grad.Float32()); err != nil {
					t.Fatalf("twin SetGrad: %v", err)
				}
				if err := opt.Step(); err != nil {
					t.Fatalf("Step: %v", err)
				}
				if err := twin.Step(); err != nil {
					t.Fatalf("twin Step: %v", err)
				}
				master, err := opt.State(p, "master")
				if err != nil {
					t.Fatalf("State(master): %v", err)
				}
				want := q.Float32()
				bad := 0
				for i := range want {
					if math.Float32bits(master[i]) != math.Float32bits(want[i]) {
						bad++
					}
				}
				if bad > 0 {
					t.Fatalf("step %d: %d master values differ from the float32 twin's param", step, bad)
				}
				if tc.scaling == ScalingDelayed {
					top := float32(0)
					for i, m := range want {
						if c := tc.f.cast(m * 0.75); codes[i] != c {
							t.Fatalf("step %d: code %d is %#x, want %#x (fp8(%g * 0.75))", step, i, codes[i], c, m)
						}
						top = float32(math.Max(float64(top), math.Abs(float64(m))))
					}
					if amax.Float32()[0] != top || scale.Float32()[0] != 0.75 {
						t.Fatalf("step %d: amax %g (want %g), scale %g (want 0.75, read only)", step, amax.Float32()[0], top, scale.Float32()[0])
					}
					continue
				}
				for b := 0; b < rows*cols/32; b++ {
					top := 0.0
					for _, m := range want[b*32 : (b+1)*32] {
						top = math.Max(top, math.Abs(float64(m)))
					}
					_, e := math.Frexp(top) // top = frac * 2^e, frac in [0.5, 1): floor(log2 top) = e - 1
					x := e - 1 - tc.f.emax
					if top == 0 {
						x = -127
					}
					x = int(math.Max(-127, math.Min(127, float64(x))))
					if got := scale.Bytes()[b]; int(got) != x+127 {
						t.Fatalf("step %d: block %d scale code %d, want %d", step, b, got, x+127)
					}
					for i := b * 32; i < (b+1)*32; i++ {
						if c := tc.f.cast(want[i] * float32(math.Ldexp(1, -x))); codes[i] != c {
							t.Fatalf("step %d: code %d is %#x, want %#x", step, i, codes[i], c)
						}
					}
				}
			}
		})
	}
}

// Options that do not fit are refused with the library's message, and nothing is added.
func TestFP8OptionsThatDoNotFitAreRefused(t *testing.T) {
	opt := newOptimizer(t)
	mustAddGroup(t, opt, DefaultGroupConfig())
	param := newHost(t, Float8E4M3FN, 4, 64) // (without a scaling: TestAnFP8ParamIsRefusedForWantOfAScaling)
	_, err := opt.AddParamTensor("w", 0, param.Tensor(), &ParamOptions{Scaling: ScalingMXFP8})
	expectError(t, "no scale", err, StatusInvalidArgument, "options.scale is NULL; SA_SCALING_MXFP8 needs one")
	wrong := newHost(t, Float32, 4, 2).Tensor()
	_, err = opt.AddParamTensor("w", 0, param.Tensor(), &ParamOptions{Scaling: ScalingMXFP8, Scale: &wrong})
	expectError(t, "float32 scale", err, StatusInvalidArgument, "options.scale is float32; it must be float8_e8m0fnu")
	if n := len(opt.params); n != 0 {
		t.Fatalf("%d params after refusals, want 0", n)
	}
	right := newHost(t, Float8E8M0FNU, 4, 2).Tensor()
	if _, err := opt.AddParamTensor("w", 0, param.Tensor(), &ParamOptions{Scaling: ScalingMXFP8, Scale: &right}); err != nil {
		t.Fatalf("AddParamTensor: %v", err)
	}
}

// A current-scaled e4m3fn param with Margin 2: every step writes [scale, scale_inv] with
// scale = (448 / amax) / 2^2 (current_pow2: rounded down to a power of two), amax the max
// |master| after the update, computed here in float32 from the masters, and casts the
// master with it.
func TestFP8CurrentScalingTakesAMargin(t *testing.T) {
	for _, scaling := range []Scaling{ScalingCurrent, ScalingCurrentPow2} {
		name := map[Scaling]string{ScalingCurrent: "current", ScalingCurrentPow2: "current_pow2"}[scaling]
		t.Run(name, func(t *testing.T) {
			const rows, cols, margin = 4, 64, 2
			rng := rand.New(rand.NewSource(11))
			param := newHost(t, e4m3.dtype, rows, cols)
			codes := param.Bytes()
			for i := range codes {
				codes[i] = e4m3.cast(float32(rng.NormFloat64() * 100))
			}
			scale := newHost(t, Float32, 2)
			scale.Float32()[0], scale.Float32()[1] = 4, 0.25 // the codes' scale_inv: master = value / 4
			st := scale.Tensor()
			opt := newOptimizer(t)
			mustAddGroup(t, opt, GroupConfig{"lr": 1e-2, "weight_decay": 0.05})
			p, err := opt.AddParamTensor("w", 0, param.Tensor(), &ParamOptions{Scaling: scaling, Scale: &st, Margin: margin})
			if err != nil {
				t.Fatalf("AddParamTensor: %v", err)
			}
			master, err := opt.State(p, "master")
			if err != nil {
				t.Fatalf("State(master): %v", err)
			}
			for i, c := range codes {
				if want := float32(e4m3.value(c)) * 0.25; master[i] != want {
					t.Fatalf("initial master %d is %g, want %g (the code's value * scale_inv)", i, master[i], want)
				}
			}
			grad := newHost(t, Float32, rows, cols)
			if err := opt.BindGrad(p, grad.Tensor()); err != nil {
				t.Fatalf("BindGrad: %v", err)
			}
			for step := 1; step <= 3; step++ {
				for i := range grad.Float32() {
					grad.Float32()[i] = float32(rng.NormFloat64() * 3)
				}
				if err := opt.Step(); err != nil {
					t.Fatalf("Step: %v", err)
				}
				master, err := opt.State(p, "master")
				if err != nil {
					t.Fatalf("State(master): %v", err)
				}
				amax := float32(0)
				for _, m := range master {
					if a := float32(math.Abs(float64(m))); a > amax {
						amax = a
					}
				}
				fp8Max := float32(e4m3.largest()) // 448
				want := fp8Max / amax / (1 << margin)
				if scaling == ScalingCurrentPow2 {
					want = math.Float32frombits(math.Float32bits(want) &^ (1<<23 - 1))
				}
				got := scale.Float32()
				if math.Float32bits(got[0]) != math.Float32bits(want) || got[1] != 1/want {
					t.Fatalf("step %d: scale [%g, %g], want [%g, %g] (448 / amax %g / 2^%d)", step, got[0], got[1], want, 1/want, amax, margin)
				}
				for i, m := range master {
					if c := e4m3.cast(m * want); codes[i] != c {
						t.Fatalf("step %d: code %d is %#x, want %#x (fp8(%g * %g))", step, i, codes[i], c, m, want)
					}
				}
			}
		})
	}
}

// An fp8 param under a current scaling with margin 2: Param.Info reports the scaling and
// the margin it was registered with, and the float32 grads and master the library gives
// fp8 params.
func TestParamInfoReportsAnFP8ParamsScalingAndMargin(t *testing.T) {
	for _, scaling := range []Scaling{ScalingCurrent, ScalingCurrentPow2} {
		opt := newOptimizer(t)
		mustAddGroup(t, opt, DefaultGroupConfig())
		param := newHost(t, Float8E4M3FN, 4, 64)
		st := unitCurrentScale(t)
		p, err := opt.AddParamTensor("w", 0, param.Tensor(), &ParamOptions{Scaling: scaling, Scale: &st, Margin: 2})
		if err != nil {
			t.Fatalf("AddParamTensor(scaling %d): %v", scaling, err)
		}
		info, err := p.Info()
		if err != nil {
			t.Fatalf("Info: %v", err)
		}
		if info.Scaling != scaling || info.Margin != 2 || info.DType != Float8E4M3FN ||
			info.GradDType != Float32 || info.Master != MasterFP32 || info.Numel != 4*64 {
			t.Errorf("Info() = %+v; want scaling %d, margin 2, dtype %s, grads %s, master %d, numel %d",
				info, scaling, Float8E4M3FN, Float32, MasterFP32, 4*64)
		}
	}
}

// A margin the current scalings cannot take, and one on a scaling without a margin, are
// refused with the library's message, and nothing is added.
func TestFP8MarginsThatDoNotFitAreRefused(t *testing.T) {
	opt := newOptimizer(t)
	mustAddGroup(t, opt, DefaultGroupConfig())
	param := newHost(t, Float8E4M3FN, 4, 64)
	cs := unitCurrentScale(t)
	_, err := opt.AddParamTensor("w", 0, param.Tensor(), &ParamOptions{Scaling: ScalingCurrent, Scale: &cs, Margin: 7})
	expectError(t, "margin 7", err, StatusInvalidArgument, "options.margin is 7; it must be 0 to 6")
	delayed := newHost(t, Float32, 1)
	delayed.Float32()[0] = 1
	ds := delayed.Tensor()
	_, err = opt.AddParamTensor("w", 0, param.Tensor(), &ParamOptions{Scaling: ScalingDelayed, Scale: &ds, Margin: 1})
	expectError(t, "delayed with a margin", err, StatusInvalidArgument,
		"options.margin is 1, but only SA_SCALING_CURRENT and SA_SCALING_CURRENT_POW2 take a margin")
	if n := len(opt.params); n != 0 {
		t.Fatalf("%d params after refusals, want 0", n)
	}
	if _, err := opt.AddParamTensor("w", 0, param.Tensor(), &ParamOptions{Scaling: ScalingCurrent, Scale: &cs, Margin: 6}); err != nil {
		t.Fatalf("AddParamTensor with margin 6: %v", err)
	}
}
