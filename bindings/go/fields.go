package shardadam

// #include <shardadam/shardadam.h>
import "C"

import (
	"math"
	"sort"
	"sync"
	"unsafe"
)

// StructKind names an option struct of the C ABI whose fields the library describes
// (sa_struct_kind).
type StructKind int32

const (
	StructGroupConfig     StructKind = C.SA_STRUCT_GROUP_CONFIG     // sa_group_config
	StructStepArgs        StructKind = C.SA_STRUCT_STEP_ARGS        // sa_step_args
	StructOptimizerConfig StructKind = C.SA_STRUCT_OPTIMIZER_CONFIG // sa_optimizer_config
	StructParamOptions    StructKind = C.SA_STRUCT_PARAM_OPTIONS    // sa_param_options
	StructImportOptions   StructKind = C.SA_STRUCT_IMPORT_OPTIONS   // sa_import_options
)

// StructField describes one field of an option struct as the library defines it
// (sa_field_info).
type StructField struct {
	Name         string  // the C member's name
	Type         int32   // an sa_field_type (SA_FIELD_DOUBLE, ...)
	Offset       uintptr // offsetof(<struct>, <name>)
	Default      float64 // its value in the struct's SA_*_INIT (0 for a pointer or a dtype)
	Min, Max     float64 // valid values: Min <= v, and v < Max, or v <= Max when MaxInclusive
	MaxInclusive bool
	Rule         string // the valid values in the words of the error messages
	Doc          string // what the field does
	DTypeRole    int32  // a dtype field: the sa_dtype_role its dtypes have
}

var structTables struct {
	sync.Mutex
	fields map[StructKind][]StructField
}

// StructFields returns the library's table of the fields of struct `kind`, in struct order.
func StructFields(kind StructKind) ([]StructField, error) {
	structTables.Lock()
	defer structTables.Unlock()
	if fields, ok := structTables.fields[kind]; ok {
		return fields, nil
	}
	n := C.sa_struct_num_fields(C.int32_t(kind))
	if n == 0 {
		return nil, bindingError(StatusInvalidArgument, "shardadam: struct kind %d has no field table in this library", int(kind))
	}
	fields := make([]StructField, 0, int(n))
	for i := C.int32_t(0); i < n; i++ {
		f := C.sa_field_info{struct_size: C.sizeof_sa_field_info}
		if err := handleless(func() C.sa_status { return C.sa_struct_field(C.int32_t(kind), i, &f) }); err != nil {
			return nil, err
		}
		fields = append(fields, StructField{Name: C.GoString(f.name), Type: int32(f._type), Offset: uintptr(f.offset),
			Default: float64(f.default_value), Min: float64(f.min), Max: float64(f.max),
			MaxInclusive: f.max_inclusive != 0, Rule: C.GoString(f.rule), Doc: C.GoString(f.doc),
			DTypeRole: int32(f.dtype_role)})
	}
	if structTables.fields == nil {
		structTables.fields = map[StructKind][]StructField{}
	}
	structTables.fields[kind] = fields
	return fields, nil
}

// setFields writes the number fields `values` names into the struct of `kind` at `s` (of
// `size` bytes, this package's), at the offsets of the library's table. The values' ranges
// are the library's to check; a name it does not know, a field that is not a number, or a
// value its C type cannot hold is refused here.
func setFields(op string, kind StructKind, s unsafe.Pointer, size C.size_t, values map[string]float64) error {
	if len(values) == 0 {
		return nil
	}
	fields, err := StructFields(kind)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	sort.Strings(names) // one error for the same map, whatever Go's iteration order
	for _, name := range names {
		v := values[name]
		var f *StructField
		for i := range fields {
			if fields[i].Name == name {
				f = &fields[i]
			}
		}
		if f == nil {
			known := make([]string, len(fields))
			for i := range fields {
				known[i] = fields[i].Name
			}
			return bindingError(StatusInvalidArgument, "%s: the options have no field '%s' (the library's: %v)", op, name, known)
		}
		width := uintptr(8) // a double or a uint64
		switch f.Type {
		case C.SA_FIELD_DOUBLE, C.SA_FIELD_UINT64:
		case C.SA_FIELD_FLAG, C.SA_FIELD_INT32:
			width = 4
		default:
			return bindingError(StatusInvalidArgument, "%s: options field '%s' is not a number (set it through its own member)", op, name)
		}
		if f.Offset+width > uintptr(size) {
			return bindingError(StatusInvalidArgument, "%s: options field '%s' lies past this package's struct (a newer library's field)", op, name)
		}
		at := unsafe.Add(s, f.Offset)
		switch f.Type {
		case C.SA_FIELD_DOUBLE:
			*(*float64)(at) = v
		case C.SA_FIELD_UINT64:
			if v != math.Trunc(v) || v < 0 || v >= 1<<64 {
				return bindingError(StatusInvalidArgument, "%s: options field '%s' is %v, not a uint64", op, name, v)
			}
			*(*uint64)(at) = uint64(v)
		default:
			if v != math.Trunc(v) || v < math.MinInt32 || v > math.MaxInt32 {
				return bindingError(StatusInvalidArgument, "%s: options field '%s' is %v, not an int32", op, name, v)
			}
			*(*int32)(at) = int32(v)
		}
	}
	return nil
}
