package shardadam

// #include <shardadam/shardadam.h>
import "C"

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
)

// DType is an element type of a param, grad or state, by the library's name for it
// ("float32"; DTypes lists what the loaded library stores). The zero value, DTypeDefault,
// stands for "the library's default" in ParamOptions. The constants below name the dtypes
// this package has typed accessors for; DType("name") names any other the library lists.
type DType string

// The dtypes this package's accessors use. 16-bit values cross the Go API as their raw
// bits ([]uint16).
const (
	DTypeDefault DType = ""              // in ParamOptions: let the library choose
	Float32      DType = "float32"       // IEEE binary32
	BFloat16     DType = "bfloat16"      // bfloat16 (the high half of a float32)
	Float16      DType = "float16"       // IEEE binary16
	Uint8        DType = "uint8"         // MomentDType: 8-bit blockwise moments
	Float8E4M3FN DType = "float8_e4m3fn" // MomentDType: float8 moments with a scale per block
	Int16        DType = "int16"         // the "remainder" state of MasterRemainder
)

// The other dtypes of the library's fp8 params (ParamOptions.Scaling): a param of
// Float8E4M3FN or Float8E5M2 (AddParamTensor), and the block scales of ScalingMXFP8.
const (
	Float8E5M2    DType = "float8_e5m2"    // an fp8 param's dtype (as float8_e4m3fn is too)
	Float8E8M0FNU DType = "float8_e8m0fnu" // the block scales of an mxfp8 param: 2^(code - 127)
)

// The roles of a dtype (DTypeInfo.Roles, sa_dtype_role bits).
const (
	RoleParam  = 1  // a param's dtype
	RoleGrad   = 2  // ParamOptions.GradDType
	RoleMoment = 4  // ParamOptions.MomentDType
	RoleState  = 8  // some state is stored in it
	RoleFile   = 16 // shard files hold tensors of it
	// RoleBlockMoment: as a moment, stored in blocks (a code per element, a float32 absmax
	// per 256 elements: states "<moment>_absmax"); shard files hold both.
	RoleBlockMoment = 32
	// RoleScale: the dtype of an fp8 param's scale tensor under some scaling
	// (sa_param_options.scale).
	RoleScale = 64
	// RoleScaledParam: a param's dtype that is cast from a float32 master under a scaling
	// (ParamOptions.Scaling): the fp8 param dtypes.
	RoleScaledParam = 128
)

// DTypeInfo describes one dtype as the library defines it (sa_dtype_info).
type DTypeInfo struct {
	Name            DType  // as the library's messages spell it
	Code, Bits      int    // its DLPack type code and bits (one lane)
	Roles           int    // Role* bits
	SafetensorsName string // "BF16"; "" when shard files never hold it
	Doc             string // what it is
}

var dtypeTable struct {
	once   sync.Once
	byName map[DType]DTypeInfo
	list   []DTypeInfo
}

// DTypes returns every dtype the loaded library stores (the table is read once).
func DTypes() []DTypeInfo {
	loadDTypes()
	return append([]DTypeInfo(nil), dtypeTable.list...)
}

func loadDTypes() {
	dtypeTable.once.Do(func() {
		dtypeTable.list = readDTypes()
		dtypeTable.byName = make(map[DType]DTypeInfo, len(dtypeTable.list))
		for _, d := range dtypeTable.list {
			dtypeTable.byName[d.Name] = d
		}
	})
}

// readDTypes reads the library's dtype table. It cannot fail for the indices the library
// itself counts, so a failure is a broken library: a panic with its message.
func readDTypes() []DTypeInfo {
	list := make([]DTypeInfo, C.sa_num_dtypes())
	for i := range list {
		d := C.sa_dtype_info{struct_size: C.sizeof_sa_dtype_info}
		if err := handleless(func() C.sa_status { return C.sa_dtype(C.int32_t(i), &d) }); err != nil {
			panic("shardadam: reading the library's dtype table: " + err.Error())
		}
		list[i] = DTypeInfo{Name: DType(C.GoString(d.name)), Code: int(d.dtype.code),
			Bits: int(d.dtype.bits), Roles: int(d.roles), Doc: C.GoString(d.doc)}
		if d.safetensors_name != nil { // NULL: shard files never hold it
			list[i].SafetensorsName = C.GoString(d.safetensors_name)
		}
	}
	return list
}

// dlpackType is d's DLPack dtype from the library's table, lanes 1 (zero for DTypeDefault,
// the library's "default"). The caller has checked d with checkDTypes.
func (d DType) dlpackType() C.DLDataType {
	code, bits, _ := d.dlpack()
	if bits == 0 {
		return C.DLDataType{}
	}
	return C.DLDataType{code: C.uint8_t(code), bits: C.uint8_t(bits), lanes: 1}
}

// dtypeOfDLPack is the library's name of a DLPack dtype (one lane) it reported; the
// library reports only dtypes of its table.
func dtypeOfDLPack(code, bits int) DType {
	loadDTypes()
	for _, d := range dtypeTable.list {
		if d.Code == code && d.Bits == bits {
			return d.Name
		}
	}
	panic(fmt.Sprintf("shardadam: the library reported DLPack dtype (code %d, bits %d), which its dtype table lacks", code, bits))
}

// String returns the dtype's name, as the library's messages spell it.
func (d DType) String() string {
	if d == DTypeDefault {
		return "default"
	}
	return string(d)
}

// dlpack returns the DLPack code and bits of d from the library's table: (0, 0) for
// DTypeDefault, and ok false for a name the library does not store.
func (d DType) dlpack() (code, bits int, ok bool) {
	if d == DTypeDefault {
		return 0, 0, true
	}
	loadDTypes()
	info, found := dtypeTable.byName[d]
	return info.Code, info.Bits, found
}

// size returns the bytes of one element of d (0 for DTypeDefault or an unknown name).
func (d DType) size() int64 {
	_, bits, _ := d.dlpack()
	return int64(bits / 8)
}

// checkDTypes returns an error naming the first of dtypes the library does not store.
func checkDTypes(op string, dtypes ...DType) error {
	for _, d := range dtypes {
		if _, _, ok := d.dlpack(); !ok {
			names := make([]string, 0, len(dtypeTable.list))
			for _, info := range dtypeTable.list {
				names = append(names, string(info.Name))
			}
			sort.Strings(names)
			return bindingError(StatusInvalidArgument, "%s: unknown dtype %q; the library stores %s", op, string(d), strings.Join(names, ", "))
		}
	}
	return nil
}

// dtypeFromDLPack maps a DLPack code and bit count back to the library's name for it
// (DTypeDefault if none).
func dtypeFromDLPack(code, bits int64) DType {
	loadDTypes()
	for _, d := range dtypeTable.list {
		if int64(d.Code) == code && int64(d.Bits) == bits {
			return d.Name
		}
	}
	return DTypeDefault
}

// BFloat16ToFloat32 widens bfloat16 bits to the float32 they stand for (exact).
func BFloat16ToFloat32(bits uint16) float32 {
	return math.Float32frombits(uint32(bits) << 16)
}

// Float32ToBFloat16 rounds f to the nearest bfloat16 (ties to even) and returns its bits.
// NaNs stay NaNs.
func Float32ToBFloat16(f float32) uint16 {
	u := math.Float32bits(f)
	if f != f { // NaN: keep it quiet and a NaN after truncation
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + ((u >> 16) & 1)
	return uint16(u >> 16)
}

// ScalingInfo describes one Scaling as the library defines it (sa_param_scaling_info).
type ScalingInfo struct {
	Value           Scaling
	Name            string // "none", "delayed", "mxfp8", "block128", "current", "current_pow2"
	Block           int64  // elements per block along the last dim; 0: one scale per tensor
	ScaleDType      DType  // the dtype of ParamOptions.Scale
	StepWritesScale bool   // true: the step writes Scale; false: it reads it (or there is none)
	Doc             string
}

// ParamScalings returns the library's table of fp8 param scalings.
func ParamScalings() []ScalingInfo {
	list := make([]ScalingInfo, C.sa_num_param_scalings())
	for i := range list {
		d := C.sa_param_scaling_info{struct_size: C.sizeof_sa_param_scaling_info}
		if err := handleless(func() C.sa_status { return C.sa_param_scaling_describe(C.int32_t(i), &d) }); err != nil {
			panic("shardadam: reading the library's scaling table: " + err.Error())
		}
		list[i] = ScalingInfo{Value: Scaling(d.value), Name: C.GoString(d.name), Block: int64(d.block),
			ScaleDType:      dtypeOfDLPack(int(d.scale_dtype.code), int(d.scale_dtype.bits)),
			StepWritesScale: d.step_writes_scale != 0, Doc: C.GoString(d.doc)}
	}
	return list
}
