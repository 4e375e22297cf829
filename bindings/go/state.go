package shardadam

/*
#include <stdlib.h>
#include <shardadam/shardadam.h>

// A state view's deleter is a C function pointer, which Go cannot call.
static void sago_call_deleter(DLManagedTensorVersioned* view) { view->deleter(view); }
*/
import "C"

import "unsafe"

// isMoment says whether key names a moment of p, which the library hands out as float32
// values whatever its storage and device (sa_optimizer_get_moment_values); the library
// says which keys those are (sa_optimizer_moment_keys).
func (o *Optimizer) isMoment(op string, p *Param, key string) (bool, error) {
	if err := o.lock(op); err != nil {
		return false, err
	}
	defer o.mu.Unlock()
	var mem cArena
	defer mem.free()
	const capacity = 16
	keys := (**C.char)(mem.alloc(capacity * unsafe.Sizeof((*C.char)(nil))))
	var count C.int32_t
	if err := o.check(C.sa_optimizer_moment_keys(o.handle, C.int64_t(p.Index), keys, capacity, &count)); err != nil {
		return false, err
	}
	for _, k := range unsafe.Slice(keys, int(count)) {
		if C.GoString(k) == key {
			return true, nil
		}
	}
	return false, nil
}

// State returns a copy of one state of a param as float32 values: "exp_avg",
// "exp_avg_sq", "max_exp_avg_sq" (AMSGrad), whatever their storage (bfloat16 widened,
// 8-bit decoded) and device, or "master" (MasterFP32) of a host optimizer. For the int16
// "remainder" state use StateInt16. On CUDA it synchronizes the device.
func (o *Optimizer) State(p *Param, key string) ([]float32, error) {
	const op = "shardadam.State"
	if err := o.checkParam(op, p); err != nil {
		return nil, err
	}
	moment, err := o.isMoment(op, p, key)
	if err != nil {
		return nil, err
	}
	if !moment {
		raw, dtype, err := o.readState(op, p, key)
		if err != nil {
			return nil, err
		}
		if dtype != Float32 {
			return nil, bindingError(StatusUnsupported, "%s: param '%s': state '%s' is %s; use StateInt16", op, p.Name, key, dtype)
		}
		return unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), p.numel)[:p.numel:p.numel], nil
	}
	if err := checkNoNUL(op, "state key", key); err != nil {
		return nil, err
	}
	var mem cArena
	defer mem.free()
	out := Tensor{Data: uintptr(mem.alloc(uintptr(p.numel) * 4)), Device: CPU(), DType: Float32, Shape: p.Shape}
	dl, err := out.cTensor(op, &mem)
	if err != nil {
		return nil, err
	}
	if err := o.lock(op); err != nil {
		return nil, err
	}
	defer o.mu.Unlock()
	if err := o.check(C.sa_optimizer_get_moment_values(o.handle, C.int64_t(p.Index), mem.str(key), dl)); err != nil {
		return nil, err
	}
	values := make([]float32, p.numel)
	copy(values, unsafe.Slice((*float32)(pointerAt(out.Data)), p.numel))
	return values, nil
}

// StateInt16 returns a copy of the int16 "remainder" state (MasterRemainder) of a param
// of a host optimizer.
func (o *Optimizer) StateInt16(p *Param, key string) ([]int16, error) {
	const op = "shardadam.StateInt16"
	if err := o.checkParam(op, p); err != nil {
		return nil, err
	}
	raw, dtype, err := o.readState(op, p, key)
	if err != nil {
		return nil, err
	}
	if dtype != Int16 {
		return nil, bindingError(StatusMismatch, "%s: param '%s': state '%s' is %s, not int16; use State", op, p.Name, key, dtype)
	}
	return unsafe.Slice((*int16)(unsafe.Pointer(&raw[0])), p.numel)[:p.numel:p.numel], nil
}

// readState copies a state of p in host memory through a state view
// (sa_optimizer_state_view) into Go memory of at least one byte, and returns its dtype.
func (o *Optimizer) readState(op string, p *Param, key string) ([]byte, DType, error) {
	if err := checkNoNUL(op, "state key", key); err != nil {
		return nil, DTypeDefault, err
	}
	var mem cArena
	defer mem.free()
	ckey := mem.str(key)
	if err := o.lock(op); err != nil {
		return nil, DTypeDefault, err
	}
	defer o.mu.Unlock()
	var view *C.DLManagedTensorVersioned
	if err := o.check(C.sa_optimizer_state_view(o.handle, C.int64_t(p.Index), ckey, &view)); err != nil {
		return nil, DTypeDefault, err
	}
	defer C.sago_call_deleter(view)
	t := &view.dl_tensor
	if t.device.device_type != C.kDLCPU {
		return nil, DTypeDefault, bindingError(StatusUnsupported, "%s: param '%s': state '%s' is in device memory; read the moments with State", op, p.Name, key)
	}
	numel := int64(1)
	for _, d := range unsafe.Slice((*int64)(unsafe.Pointer(t.shape)), int(t.ndim)) {
		numel *= d
	}
	nbytes := numel * int64((t.dtype.bits+7)/8)
	raw := make([]byte, 4*p.numel+1) // room for the widest state; never empty
	if nbytes > int64(len(raw)) {
		return nil, DTypeDefault, bindingError(StatusInternal, "%s: param '%s': state '%s' has %d bytes, more than 4 per element", op, p.Name, key, nbytes)
	}
	copy(raw, unsafe.Slice((*byte)(unsafe.Add(t.data, t.byte_offset)), nbytes))
	return raw, dtypeFromDLPack(int64(t.dtype.code), int64(t.dtype.bits)), nil
}
