package shardadam

// #include <stdlib.h>
// #include <shardadam/shardadam.h>
import "C"

import (
	"sync"
	"unsafe"
)

// StepArgs holds the options of StepWith (sa_step_args). The zero value is a plain step
// on the legacy default stream.
//
// With a communicator set (SetComm) a step with a norm or a found-inf flag is collective:
// every rank must call it, with the same MaxGradNorm and NormType, and with the found-inf
// flag handed over (FoundInf or ReduceFoundInf set) on all ranks or on none.
type StepArgs struct {
	// Stream is the CUDA stream (a cudaStream_t) a CUDA optimizer enqueues the step on; 0
	// is the legacy default stream. The CPU backend ignores it.
	Stream uintptr
	// InvGradScale multiplies every grad before use (the inverse loss scale of mixed
	// precision training); 0 means 1. CPU optimizers only: the library reads the scale in
	// the optimizer's memory, so a CUDA optimizer takes it from InvGradScaleAt.
	InvGradScale float32
	// InvGradScaleAt is the address of one float32 holding the inverse loss scale, in the
	// optimizer's memory: device memory for a CUDA optimizer (read when the stream reaches
	// the step), C host memory for a CPU one. 0: none. Not with InvGradScale.
	InvGradScaleAt uintptr
	// FoundInf skips the whole step: no param, state or step count changes. With a
	// communicator the flags of all ranks are OR-reduced, so a flag on one rank skips the
	// step everywhere; then the other ranks set ReduceFoundInf. CPU optimizers only; a
	// CUDA optimizer takes the flag from FoundInfAt.
	FoundInf bool
	// FoundInfAt is the address of one float32, nonzero to skip the step, in the
	// optimizer's memory as InvGradScaleAt is (0: none; not with FoundInf or
	// ReduceFoundInf, which it implies). Setting it, as FoundInf or ReduceFoundInf, makes
	// the step report Skipped, which on CUDA synchronizes the stream.
	FoundInfAt uintptr
	// ReduceFoundInf hands the found-inf flag to the step even when FoundInf is false, so
	// that with a communicator every rank takes part in the found-inf consensus. A loss
	// scaler sets it on every rank at every step. CPU optimizers only: on CUDA, FoundInfAt
	// (the device flag, 0 or not) takes part.
	ReduceFoundInf bool
	// MaxGradNorm 0 computes no norm. A bound > 0 makes the step compute the norm of all
	// grads of all ranks (after InvGradScale; a shard replicated along a mesh dim counts
	// once) and scale every grad by min(1, MaxGradNorm / (norm + 1e-6)) inside the update,
	// as torch.nn.utils.clip_grad_norm_ does; the grad buffers are not written.
	// math.Inf(1) measures without clipping. A non-finite norm skips the step on every
	// rank. Without a communicator the norm is this rank's own. The norm comes back in
	// StepReport, so on CUDA such a step synchronizes the stream.
	MaxGradNorm float64
	// NormType is the norm MaxGradNorm bounds: NormL2 (the zero value) or NormInf.
	NormType NormType
}

// StepReport says what a step did.
type StepReport struct {
	// Skipped: a found-inf flag on some rank, or a non-finite norm. No param, state or step
	// count changed. Only a step given a found-inf flag or a norm bound can be skipped.
	Skipped bool
	// GradNorm is the global grad norm when StepArgs.MaxGradNorm asked for one (NaN or
	// infinite when a grad was; the step was then skipped), else 0. Every rank gets the
	// same bits.
	GradNorm float64
}

// stepFields are the offsets in sa_step_args of the fields the package fills, read by
// name from the library's table (sa_step_args_field), with the struct size this package
// was compiled against.
var stepFields struct {
	once sync.Once
	err  error
	// where each field is
	invGradScale, foundInf, skipped uintptr
	maxGradNorm, normType           uintptr
	hostGradNorm                    uintptr
}

func loadStepFields() error {
	stepFields.once.Do(func() {
		want := map[string]struct {
			typ C.int32_t
			at  *uintptr
		}{
			"inv_grad_scale": {C.SA_FIELD_POINTER, &stepFields.invGradScale},
			"found_inf":      {C.SA_FIELD_POINTER, &stepFields.foundInf},
			"skipped":        {C.SA_FIELD_POINTER, &stepFields.skipped},
			"max_grad_norm":  {C.SA_FIELD_DOUBLE, &stepFields.maxGradNorm},
			"norm_type":      {C.SA_FIELD_INT32, &stepFields.normType},
			"host_grad_norm": {C.SA_FIELD_POINTER, &stepFields.hostGradNorm},
		}
		found := 0
		for i := C.int32_t(0); i < C.sa_step_args_num_fields(); i++ {
			f := C.sa_field_info{struct_size: C.sizeof_sa_field_info}
			if err := handleless(func() C.sa_status { return C.sa_step_args_field(i, &f) }); err != nil {
				stepFields.err = err
				return
			}
			w, ok := want[C.GoString(f.name)]
			if !ok {
				continue // a field this package does not set keeps its default (zero)
			}
			size := uintptr(8) // a double or a pointer
			if w.typ == C.SA_FIELD_INT32 {
				size = 4
			}
			if f._type != w.typ || uintptr(f.offset)+size > C.sizeof_sa_step_args {
				stepFields.err = bindingError(StatusInternal, "shardadam: the library's sa_step_args field '%s' (type %d, offset %d) does not fit this package's shardadam.h", C.GoString(f.name), int(f._type), int(f.offset))
				return
			}
			*w.at = uintptr(f.offset)
			found++
		}
		if found != len(want) {
			stepFields.err = bindingError(StatusInternal, "shardadam: the library lists %d of the %d sa_step_args fields this package sets", found, len(want))
		}
	})
	return stepFields.err
}

// stepBlock is one optimizer's step arguments and what they point to, in C memory
// allocated once: a step allocates and copies nothing, and the library may read the
// pointed-to host values during the call.
type stepBlock struct {
	mem          unsafe.Pointer
	args         unsafe.Pointer // sa_step_args
	invGradScale *C.float
	foundInf     *C.float
	skipped      *C.int32_t
	hostGradNorm *C.double
}

func newStepBlock() (*stepBlock, error) {
	if err := loadStepFields(); err != nil {
		return nil, err
	}
	size := (C.sizeof_sa_step_args + 7) &^ 7
	mem := C.calloc(1, C.size_t(size+24))
	if mem == nil {
		return nil, bindingError(StatusOutOfMemory, "shardadam.NewOptimizer: cannot allocate the step arguments")
	}
	b := &stepBlock{mem: mem, args: mem,
		hostGradNorm: (*C.double)(unsafe.Add(mem, size)),
		invGradScale: (*C.float)(unsafe.Add(mem, size+8)),
		foundInf:     (*C.float)(unsafe.Add(mem, size+12)),
		skipped:      (*C.int32_t)(unsafe.Add(mem, size+16))}
	*(*C.size_t)(b.args) = C.sizeof_sa_step_args // struct_size, the first member
	return b, nil
}

func (b *stepBlock) free() {
	C.free(b.mem)
	b.mem = nil
}

// fill writes args into the block for a step of an optimizer on device (nil before any
// param: the library then has nothing to update).
func (b *stepBlock) fill(op string, args StepArgs, device *Device) error {
	onCUDA := device != nil && device.Kind == KindCUDA
	if onCUDA && (args.InvGradScale != 0 || args.FoundInf || args.ReduceFoundInf) {
		return bindingError(StatusInvalidArgument, "%s: a CUDA optimizer reads the loss scale and the found-inf flag in device memory: use StepArgs.InvGradScaleAt and FoundInfAt (InvGradScale, FoundInf and ReduceFoundInf are host values)", op)
	}
	if (args.InvGradScaleAt != 0 && args.InvGradScale != 0) || (args.FoundInfAt != 0 && (args.FoundInf || args.ReduceFoundInf)) {
		return bindingError(StatusInvalidArgument, "%s: give the loss scale and the found-inf flag either as values (InvGradScale, FoundInf) or by address (InvGradScaleAt, FoundInfAt), not both", op)
	}
	field := func(offset uintptr) unsafe.Pointer { return unsafe.Add(b.args, offset) }
	*b.invGradScale, *b.foundInf, *b.skipped, *b.hostGradNorm = C.float(args.InvGradScale), 0, 0, 0
	if args.FoundInf {
		*b.foundInf = 1
	}
	invGradScale, foundInf, skipped, hostGradNorm := args.InvGradScaleAt, args.FoundInfAt, uintptr(0), uintptr(0)
	if args.InvGradScale != 0 {
		invGradScale = uintptr(unsafe.Pointer(b.invGradScale))
	}
	if args.FoundInf || args.ReduceFoundInf {
		foundInf = uintptr(unsafe.Pointer(b.foundInf))
	}
	// Asking whether the step was skipped, or for the norm on the host, synchronizes a
	// CUDA stream: only a step that can be skipped asks.
	if foundInf != 0 || args.MaxGradNorm != 0 {
		skipped = uintptr(unsafe.Pointer(b.skipped))
	}
	if args.MaxGradNorm != 0 {
		hostGradNorm = uintptr(unsafe.Pointer(b.hostGradNorm))
	}
	setAddress(field(stepFields.invGradScale), invGradScale)
	setAddress(field(stepFields.foundInf), foundInf)
	setAddress(field(stepFields.skipped), skipped)
	setAddress(field(stepFields.hostGradNorm), hostGradNorm)
	*(*C.double)(field(stepFields.maxGradNorm)) = C.double(args.MaxGradNorm)
	*(*C.int32_t)(field(stepFields.normType)) = C.int32_t(args.NormType)
	return nil
}

// Step runs one optimizer step over every param that has a grad, advancing its step count
// and each group's, on the legacy default stream of a CUDA optimizer (StepWith takes a
// stream). Every non-empty param needs a grad bound (BindGrad, HostGrad, SetGrad, ...) or
// to be marked as having none (ClearGrad, a nil entry) first (StatusState otherwise,
// naming the param, and nothing is updated).
func (o *Optimizer) Step() error {
	_, err := o.StepWith(StepArgs{})
	return err
}

// StepWith is Step with a stream, a loss scale, a found-inf flag and grad clipping (see
// StepArgs). It reports whether the step was skipped and the norm.
//
// When it returns (sa_optimizer_step): CPU: the step is done. CUDA: the step is enqueued
// on args.Stream and the host does not wait, unless the step reports a found-inf skip or
// a norm (FoundInfAt, MaxGradNorm), which reads them back; the bound grads (and the
// loss scale and flag) must hold their values until the stream reaches the step, and the
// params hold the result once it has passed it. The first step after params were added
// builds the launch plan (on CUDA it synchronizes); later steps allocate nothing, and
// this package copies nothing.
//
// A failing host communicator fails the step with StatusComm before anything changed on
// this rank; the message ends with the function's error (or its panic).
func (o *Optimizer) StepWith(args StepArgs) (StepReport, error) {
	const op = "shardadam.Step"
	if err := o.lock(op); err != nil {
		return StepReport{}, err
	}
	defer o.mu.Unlock()
	return o.runStep(op, args, false)
}

// runStep runs sa_optimizer_step, or with partial sa_optimizer_step_params over the indices
// in o.partial, with args. The caller holds o's lock.
func (o *Optimizer) runStep(op string, args StepArgs, partial bool) (StepReport, error) {
	if err := o.step.fill(op, args, o.device); err != nil {
		return StepReport{}, err
	}
	var host *hostComm
	if o.comm != nil && o.comm.host != nil {
		host = o.comm.host
		host.takeError() // forget an earlier step's
	}
	var status C.sa_status
	if partial {
		// The indices are Go memory without Go pointers, read during the call only.
		status = C.sa_optimizer_step_params(o.handle, C.int64_t(len(o.partial)), (*C.int64_t)(firstElem(o.partial)),
			(*C.sa_step_args)(o.step.args), pointerAt(args.Stream))
	} else {
		status = C.sa_optimizer_step(o.handle, (*C.sa_step_args)(o.step.args), pointerAt(args.Stream))
	}
	if err := o.check(status); err != nil {
		if e := err.(*Error); e.Status == StatusComm && host != nil {
			if why := host.takeError(); why != "" {
				e.Message += ": " + why
			}
		}
		return StepReport{}, err
	}
	return StepReport{Skipped: *o.step.skipped != 0, GradNorm: float64(*o.step.hostGradNorm)}, nil
}

// StepParams is a partial step (sa_optimizer_step_params): StepWith for params only (each
// at most once, in any order), every other param left as it is (values, state and step
// count), as if it had no grad. For an engine that steps each layer as soon as its grads
// are ready, or offloaded state a part at a time.
//
// Per-param step counts (ParamSteps) advance as in a step, so bias correction is exact
// however the params are split; group step counts (StepCount) do not (they count full
// steps). A listed param marked as having no grad is skipped; one never given a grad is
// refused (StatusState), as in a step; the others need no grad. args are StepWith's (the
// stream, loss scale and found-inf flag apply to the listed params), except clipping:
// MaxGradNorm must be 0 (StatusInvalidArgument), since the norm is that of every grad;
// clip in a full step. A param listed twice, or one of another optimizer, is
// StatusInvalidArgument. Everything is checked before anything changes. When it returns:
// as StepWith.
func (o *Optimizer) StepParams(params []*Param, args StepArgs) (StepReport, error) {
	const op = "shardadam.StepParams"
	if err := o.lock(op); err != nil {
		return StepReport{}, err
	}
	defer o.mu.Unlock()
	o.partial = o.partial[:0] // reused: a partial step allocates nothing once it has grown
	for _, p := range params {
		if err := o.checkParam(op, p); err != nil {
			return StepReport{}, err
		}
		o.partial = append(o.partial, p.Index)
	}
	return o.runStep(op, args, true)
}

// Flush enqueues on stream (a cudaStream_t; 0: the legacy default stream) the upload of
// what changed on the host since the last step: grad bindings and hyperparameters
// (sa_optimizer_flush). Step does this itself; Flush is needed only before replaying a
// step captured in a CUDA graph. It returns once the upload is enqueued. The CPU backend
// has nothing to upload.
func (o *Optimizer) Flush(stream uintptr) error {
	if err := o.lock("shardadam.Flush"); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return o.check(C.sa_optimizer_flush(o.handle, pointerAt(stream)))
}
