package shardadam

import "math"

// DType is an element type of a param, grad or state. The zero value, DTypeDefault,
// stands for "the library's default" in ParamOptions.
type DType int

// The dtypes shardadam stores. 16-bit values cross the Go API as their raw bits ([]uint16).
const (
	DTypeDefault DType = iota // in ParamOptions: let the library choose
	Float32                   // IEEE binary32
	BFloat16                  // bfloat16 (the high half of a float32)
	Float16                   // IEEE binary16
	Int16                     // the "remainder" state of SA_MASTER_REMAINDER
)

// DLPack type codes (dlpack.h): kDLInt, kDLFloat, kDLBfloat.
const (
	dlInt    = 0
	dlFloat  = 2
	dlBfloat = 4
)

// String returns the dtype's name, as the library's messages spell it.
func (d DType) String() string {
	switch d {
	case DTypeDefault:
		return "default"
	case Float32:
		return "float32"
	case BFloat16:
		return "bfloat16"
	case Float16:
		return "float16"
	case Int16:
		return "int16"
	}
	return "invalid dtype"
}

// dlpack returns the DLPack code and bits of d; (0, 0) for DTypeDefault.
func (d DType) dlpack() (code, bits int) {
	switch d {
	case Float32:
		return dlFloat, 32
	case BFloat16:
		return dlBfloat, 16
	case Float16:
		return dlFloat, 16
	case Int16:
		return dlInt, 16
	}
	return 0, 0
}

// size returns the bytes of one element of d (0 for DTypeDefault).
func (d DType) size() int64 {
	_, bits := d.dlpack()
	return int64(bits / 8)
}

// dtypeFromDLPack maps a DLPack code and bit count back to a DType (DTypeDefault if none).
func dtypeFromDLPack(code, bits int64) DType {
	for _, d := range []DType{Float32, BFloat16, Float16, Int16} {
		c, b := d.dlpack()
		if int64(c) == code && int64(b) == bits {
			return d
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
