package shardadam

import (
	"reflect"
	"testing"
)

// The library's field tables, as StructFields reads them, name the C members in order.
func TestStructFieldsAreTheLibrarysTables(t *testing.T) {
	want := map[StructKind][]string{
		StructParamOptions:    {"grad_dtype", "moment_dtype", "master", "scale", "amax", "scaling", "margin", "state_placement"},
		StructOptimizerConfig: {"num_threads", "cpu_simd"},
		StructImportOptions:   {"staging_bytes", "allow_missing", "allow_unexpected", "restore_groups", "read_once"},
	}
	for kind, names := range want {
		fields, err := StructFields(kind)
		if err != nil {
			t.Fatalf("StructFields(%d): %v", kind, err)
		}
		var got []string
		for _, f := range fields {
			got = append(got, f.Name)
		}
		if !reflect.DeepEqual(got, names) {
			t.Fatalf("StructFields(%d) names %v, want %v", kind, got, names)
		}
	}
	if _, err := StructFields(StructKind(99)); err == nil {
		t.Fatal("StructFields(99) returned no error")
	}
}

// ParamOptions.Fields reaches the library by the table's names: the library checks a value
// as it checks the typed members', a field given both ways takes the Fields value, and
// unknown names and non-number fields are refused before the library is called.
func TestParamOptionsFieldsTravelByName(t *testing.T) {
	opt := newOptimizer(t)
	mustAddGroup(t, opt, DefaultGroupConfig())
	_, err := opt.AddParam("w", 0, []int64{8}, make([]float32, 8), &ParamOptions{Fields: map[string]float64{"state_placement": 9}})
	expectError(t, "placement 9", err, StatusInvalidArgument, "options.state_placement is 9; it must be an sa_state_placement")
	_, err = opt.AddParam("w", 0, []int64{8}, make([]float32, 8), &ParamOptions{Fields: map[string]float64{"margins": 1}})
	expectError(t, "unknown name", err, StatusInvalidArgument, "no field 'margins'")
	_, err = opt.AddParam("w", 0, []int64{8}, make([]float32, 8), &ParamOptions{Fields: map[string]float64{"scale": 1}})
	expectError(t, "pointer field", err, StatusInvalidArgument, "'scale' is not a number")
	_, err = opt.AddParam("w", 0, []int64{8}, make([]float32, 8), &ParamOptions{Fields: map[string]float64{"master": 1.5}})
	expectError(t, "fraction", err, StatusInvalidArgument, "'master' is 1.5, not an int32")
	if n := len(opt.params); n != 0 {
		t.Fatalf("%d params after refusals, want 0", n)
	}
	// SA_MASTER_REMAINDER (3) by name over the typed MasterNone: the library refuses it for
	// a float32 param, so the Fields value is the one that arrived.
	_, err = opt.AddParam("w", 0, []int64{8}, make([]float32, 8), &ParamOptions{Master: MasterNone, Fields: map[string]float64{"master": 3}})
	expectError(t, "remainder for float32", err, StatusUnsupported, "master SA_MASTER_REMAINDER")
	p, err := opt.AddParam("w", 0, []int64{8}, make([]float32, 8), &ParamOptions{Fields: map[string]float64{"master": 1}})
	if err != nil || p == nil {
		t.Fatalf("AddParam with master 1 (SA_MASTER_NONE) by name: %v", err)
	}
}

// LoadOptions.Fields reaches sa_import_options by the table's names: allow_missing by name
// lets a param absent from the files keep its state, restore_groups 0 by name keeps the
// groups (over the typed KeepGroups false), the library refuses a flag of 2, and an
// unknown name is refused before anything is read.
func TestLoadOptionsFieldsTravelByName(t *testing.T) {
	saved := newOptimizer(t)
	mustAddGroup(t, saved, GroupConfig{"lr": 0.25})
	w, err := saved.AddParam("w", 0, []int64{6}, []float32{1, 2, 3, 4, 5, 6}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := saved.SetGrad(w, []float32{1, -1, 1, -1, 1, -1}); err != nil {
		t.Fatal(err)
	}
	if err := saved.Step(); err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/rank0.safetensors"
	if err := saved.Save(path); err != nil {
		t.Fatal(err)
	}
	want, err := saved.State(w, "exp_avg")
	if err != nil {
		t.Fatal(err)
	}

	opt := newOptimizer(t)
	mustAddGroup(t, opt, GroupConfig{"lr": 0.5})
	w2, err := opt.AddParam("w", 0, []int64{6}, make([]float32, 6), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := opt.AddParam("extra", 0, []int64{3}, make([]float32, 3), nil); err != nil {
		t.Fatal(err)
	}
	paths := []string{path}
	expectError(t, "extra missing", opt.Load(paths, nil), StatusMismatch, "'extra'")
	expectError(t, "flag of 2", opt.Load(paths, &LoadOptions{Fields: map[string]float64{"allow_missing": 2}}),
		StatusInvalidArgument, "allow_missing is 2")
	expectError(t, "unknown name", opt.Load(paths, &LoadOptions{Fields: map[string]float64{"allow_missed": 1}}),
		StatusInvalidArgument, "no field 'allow_missed'")
	if err := opt.Load(paths, &LoadOptions{Fields: map[string]float64{"allow_missing": 1, "restore_groups": 0}}); err != nil {
		t.Fatalf("Load with allow_missing and restore_groups 0 by name: %v", err)
	}
	if got, err := opt.State(w2, "exp_avg"); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("exp_avg after Load = %v, %v; want the saved %v", got, err, want)
	}
	if g, err := opt.Group(0); err != nil || g["lr"] != 0.5 {
		t.Errorf("lr after a Load that keeps the groups = %v, %v; want 0.5", g["lr"], err)
	}
}
