package shardadam

import (
	"errors"
	"strings"
	"testing"
)

// The dtype table comes from the library (sa_dtype): its codes are DLPack's (dlpack.h's
// DLDataTypeCode: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4) and its roles are what
// AddParam accepts.
func TestDTypesAreTheLibrarysWithDLPackCodes(t *testing.T) {
	want := map[DType][2]int{Float32: {2, 32}, BFloat16: {4, 16}, Float16: {2, 16}, Uint8: {1, 8}, Float8E4M3FN: {10, 8}, Int16: {0, 16}}
	got := DTypes()
	if len(got) != len(want) {
		t.Fatalf("DTypes() has %d dtypes, want %d: %+v", len(got), len(want), got)
	}
	for _, d := range got {
		w, ok := want[d.Name]
		if !ok || d.Code != w[0] || d.Bits != w[1] {
			t.Errorf("dtype %s: code %d bits %d, want %v", d.Name, d.Code, d.Bits, w)
		}
		if d.Doc == "" {
			t.Errorf("dtype %s has no doc", d.Name)
		}
	}
	for _, d := range got {
		opt := newOptimizer(t)
		mustAddGroup(t, opt, nil)
		_, err := opt.AddParam("p", 0, []int64{300}, make([]float32, 300), &ParamOptions{MomentDType: d.Name})
		if (err == nil) != (d.Roles&RoleMoment != 0) {
			t.Errorf("moment dtype %s: AddParam error %v, but roles %b", d.Name, err, d.Roles)
		}
	}
}

func TestAnUnknownDTypeIsRefusedByName(t *testing.T) {
	opt := newOptimizer(t)
	mustAddGroup(t, opt, nil)
	_, err := opt.AddParam("p", 0, []int64{4}, make([]float32, 4), &ParamOptions{MomentDType: "float8"})
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusInvalidArgument ||
		!strings.Contains(err.Error(), `unknown dtype "float8"; the library stores bfloat16, float16, float32, float8_e4m3fn, int16, uint8`) {
		t.Fatalf("AddParam with moment dtype float8: %v", err)
	}
	if n := len(opt.params); n != 0 {
		t.Fatalf("a refused AddParam left %d params", n)
	}
}
