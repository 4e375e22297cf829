// Package shardadam runs fused Adam/AdamW steps over the local shards of globally shaped
// params, through the shardadam C library (libshardadam.so).
//
// An Optimizer owns its params: AddParam copies the initial values into C memory that the
// library updates in place at every Step, and Param.Float32 / Param.Bits16 view that
// memory from Go without copying. Grads are copied in by SetGrad or SetGrads into a C
// buffer the library keeps bound, so no Go memory is ever retained by C (the cgo pointer
// rules), and the library checks every binding. A param may have no grad at a step
// (ClearGrad, a nil entry of SetGrads): it is then skipped, as torch skips a param whose
// .grad is None, and its own step count (ParamSteps) does not advance.
// States are copied out by State. Save and Load write and read shard files (one per rank;
// any set of them loads onto any layout).
//
// A group's hyperparameters are a GroupConfig, a map from the library's field names to
// values, e.g. GroupConfig{"lr": 1e-2} (the fields it leaves out keep their defaults).
// GroupFields describes each field (default, valid values, doc) from the library's own
// table, so this package spells none of them and gets every field the library adds.
//
// A step can clip the grads by their global norm (StepArgs.MaxGradNorm). Each rank's
// optimizer holds its own shards, so the ranks agree on the norm through a Comm given to
// SetComm: NCCL for CUDA params, or a Go function over the caller's own transport
// (NewHostComm).
//
// Every failure is an *Error carrying the library's status and message. The message is
// copied inside the native call that failed, so it is the right one whichever OS thread
// the goroutine runs on afterwards.
//
// An Optimizer may be used from several goroutines: its methods serialize on a mutex, as
// the library requires. Call Close when done; it frees the params, their grads and the
// state.
//
// Building: the package needs SWIG (it runs on internal/capi/capi.swig), the header
// directories and the library:
//
//	CGO_CFLAGS="-I<dir with dlpack/dlpack.h >= 1.0>" \
//	CGO_LDFLAGS="-L<build dir> -Wl,-rpath,<build dir>" go test ./...
package shardadam

import (
	"strings"
	"sync"
	"unsafe"

	"github.com/shardadam/shardadam/bindings/go/internal/capi"
)

// Version returns the version of the loaded library as MAJOR*10000 + MINOR*100 + PATCH.
func Version() int { return capi.Sa_version() }

// BuildInfo returns the library's one-line description of its version and backends.
func BuildInfo() string { return capi.Sa_build_info() }

// Config holds the options of NewOptimizer (sa_optimizer_config). The zero value gives the
// library's defaults.
type Config struct {
	NumThreads int  // CPU backend worker threads; 0: one per hardware thread
	ScalarOnly bool // CPU backend: never use SIMD (results are the same, only slower)
}

// Optimizer is a shardadam optimizer: groups of hyperparameters, params with their state.
// Create it with NewOptimizer and release it with Close.
type Optimizer struct {
	mu     sync.Mutex
	handle capi.Struct_SS_sa_optimizer // nil once closed
	errbuf []byte                      // where each call copies its error message
	params []*Param
	comm   *Comm // the last SetComm's, to read why a host communicator's function failed
}

// NewOptimizer creates an empty optimizer. cfg may be nil (defaults).
func NewOptimizer(cfg *Config) (*Optimizer, error) {
	numThreads, simd := 0, 1
	if cfg != nil {
		numThreads = cfg.NumThreads
		if cfg.ScalarOnly {
			simd = 0
		}
	}
	errbuf := make([]byte, errorBufferBytes)
	status := []int{0}
	handle := capi.Sago_create(numThreads, simd, status, errbuf)
	if err := resultError(status[0], errbuf); err != nil {
		return nil, err
	}
	return &Optimizer{handle: handle, errbuf: errbuf}, nil
}

// Close destroys the optimizer: its state, its params' memory (so every slice returned by
// Param.Float32 or Param.Bits16 becomes invalid) and the grad buffers. Closing twice is a
// no-op. It always returns nil.
func (o *Optimizer) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.handle == nil {
		return nil
	}
	capi.Sago_destroy(o.handle) // calls each param's DLPack deleter, which frees its data
	o.handle = nil
	for _, p := range o.params {
		capi.Free(p.grad)
		p.grad, p.data = nil, nil
	}
	o.params = nil
	o.comm = nil
	return nil
}

// lock takes the optimizer's mutex and checks that it is open. The caller unlocks.
func (o *Optimizer) lock(op string) error {
	o.mu.Lock()
	if o.handle == nil {
		o.mu.Unlock()
		return bindingError(StatusState, "%s: the optimizer is closed", op)
	}
	return nil
}

// flag is a bool as the C helpers take it.
func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ---- params ------------------------------------------------------------------------

// MasterKind says how a param keeps its full-precision value (sa_master_kind).
type MasterKind int

// The master kinds.
const (
	MasterAuto      MasterKind = 0 // none for float32 params, float32 master for 16-bit params
	MasterNone      MasterKind = 1 // update the param in its own dtype (float32 params only)
	MasterFP32      MasterKind = 2 // keep a float32 master copy; the param is its rounding
	MasterRemainder MasterKind = 3 // bfloat16 params: keep the int16 low half of the float32
)

// ParamOptions holds the per-param choices of AddParam. The zero value gives the defaults.
type ParamOptions struct {
	Layout      *Layout    // where the shard sits in its global tensor; nil: not sharded
	GradDType   DType      // Float32, BFloat16 or Float16; DTypeDefault: the param's dtype
	MomentDType DType      // Float32 (DTypeDefault), BFloat16, Uint8 (8-bit blockwise) or Float8E4M3FN
	Master      MasterKind // how the full-precision value is kept
}

// Param is a registered local shard. Its data lives in C memory owned by the optimizer
// until Close.
type Param struct {
	Index     int64   // the library's index of the param (0, 1, ... in order of addition)
	Name      string  // its fully qualified name
	DType     DType   // the dtype of the param's data
	GradDType DType   // the dtype SetGrad / SetGrad16 must bind
	Shape     []int64 // the local shape

	opt   *Optimizer
	numel int64
	data  unsafe.Pointer // C memory; the library frees it (DLPack deleter) at Close
	grad  unsafe.Pointer // C memory for the bound grad; nil until the first SetGrad
}

// Numel returns the number of local elements.
func (p *Param) Numel() int64 { return p.numel }

// Float32 returns the param's values as a slice over its C memory, or nil when the param
// is not float32. Each Step updates them in place; writes change the param. The slice is
// valid until Close, and must not be used while a Step runs in another goroutine.
func (p *Param) Float32() []float32 {
	if p.DType != Float32 || p.data == nil {
		return nil
	}
	return unsafe.Slice((*float32)(p.data), p.numel)
}

// Bits16 returns the raw bits of a bfloat16 or float16 param as a slice over its C memory,
// or nil for other dtypes; the same rules as Float32 apply.
func (p *Param) Bits16() []uint16 {
	if (p.DType != BFloat16 && p.DType != Float16) || p.data == nil {
		return nil
	}
	return unsafe.Slice((*uint16)(p.data), p.numel)
}

// numelOf returns the product of shape, or an error naming the param for a negative dim.
func numelOf(op, name string, shape []int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, bindingError(StatusInvalidArgument, "%s: param '%s': shape %v has a negative dim", op, name, shape)
		}
		n *= d
	}
	return n, nil
}

// AddParam registers a float32 local shard named `name` (the fully qualified name
// checkpoints match on) in `group`. shape is the local shape; init (copied) holds its
// prod(shape) values in row-major order. opts may be nil.
func (o *Optimizer) AddParam(name string, group int, shape []int64, init []float32, opts *ParamOptions) (*Param, error) {
	var src unsafe.Pointer
	if len(init) > 0 {
		src = unsafe.Pointer(&init[0])
	}
	return o.addParam("shardadam.AddParam", name, group, Float32, shape, src, int64(len(init)), opts)
}

// AddParam16 registers a bfloat16 or float16 local shard from its raw bits (see
// Float32ToBFloat16); otherwise as AddParam. By default the optimizer keeps a float32
// master copy (MasterAuto).
func (o *Optimizer) AddParam16(name string, group int, dtype DType, shape []int64, init []uint16, opts *ParamOptions) (*Param, error) {
	if dtype != BFloat16 && dtype != Float16 {
		return nil, bindingError(StatusInvalidArgument, "shardadam.AddParam16: param '%s': dtype %s is not bfloat16 or float16", name, dtype)
	}
	var src unsafe.Pointer
	if len(init) > 0 {
		src = unsafe.Pointer(&init[0])
	}
	return o.addParam("shardadam.AddParam16", name, group, dtype, shape, src, int64(len(init)), opts)
}

func (o *Optimizer) addParam(op, name string, group int, dtype DType, shape []int64, src unsafe.Pointer, count int64, opts *ParamOptions) (*Param, error) {
	if opts == nil {
		opts = &ParamOptions{}
	}
	if strings.IndexByte(name, 0) >= 0 {
		return nil, bindingError(StatusInvalidArgument, "%s: param name %q contains a NUL byte", op, name)
	}
	numel, err := numelOf(op, name, shape)
	if err != nil {
		return nil, err
	}
	if count != numel {
		return nil, bindingError(StatusInvalidArgument, "%s: param '%s': init has %d values, shape %v needs %d", op, name, count, shape, numel)
	}
	if err := checkDTypes(op, dtype, opts.GradDType, opts.MomentDType); err != nil {
		return nil, err
	}
	if err := o.lock(op); err != nil {
		return nil, err
	}
	defer o.mu.Unlock()

	nbytes := numel * dtype.size()
	data := capi.Alloc(nbytes)
	if data == nil {
		return nil, bindingError(StatusOutOfMemory, "%s: param '%s': cannot allocate %d bytes", op, name, nbytes)
	}
	if nbytes > 0 {
		copy(unsafe.Slice((*byte)(data), nbytes), unsafe.Slice((*byte)(src), nbytes))
	}

	hasLayout, boxForm := 0, 0
	var l Layout
	if opts.Layout != nil {
		hasLayout, l = 1, *opts.Layout
		if l.GlobalOffset != nil {
			boxForm = 1
		}
	}
	paramCode, paramBits, _ := dtype.dlpack()
	gradCode, gradBits, _ := opts.GradDType.dlpack()
	momentCode, momentBits, _ := opts.MomentDType.dlpack()
	index := []int64{-1}
	status := capi.Sago_add_param(o.handle, name, group, paramCode, paramBits, uintptr(data), shape,
		hasLayout, l.GlobalShape, l.MeshShape, l.MeshCoord, l.placementPairs(), boxForm,
		l.GlobalOffset, gradCode, gradBits, momentCode, momentBits, int(opts.Master), index,
		o.errbuf)
	if err := resultError(status, o.errbuf); err != nil {
		capi.Free(data) // on failure the library did not take ownership
		return nil, err
	}
	gradDType := opts.GradDType
	if gradDType == DTypeDefault {
		gradDType = dtype
	}
	p := &Param{Index: index[0], Name: name, DType: dtype, GradDType: gradDType,
		Shape: append([]int64(nil), shape...), opt: o, numel: numel, data: data}
	o.params = append(o.params, p)
	return p, nil
}

// ---- grads -------------------------------------------------------------------------
//
// A param either has a grad at the next steps or has none: steps then skip it (its values,
// state and step count stay, as torch skips a param whose .grad is None). A param given
// neither since it was added fails the step with StatusState. Every binding below copies
// into a C buffer the optimizer owns and is checked by the library (sa_optimizer_set_grad,
// sa_optimizer_set_grads); the package never hands grad pointers to
// sa_optimizer_set_grad_ptrs, the C fast path that trusts its caller.

// SetGrad copies float32 grads into the param's grad buffer, which stays bound for every
// later Step until the next binding. The library checks the dtype against the registered
// grad dtype (an *Error with StatusMismatch naming the param otherwise); on any error the
// bound grad is unchanged.
func (o *Optimizer) SetGrad(p *Param, grad []float32) error {
	return o.setGrad("shardadam.SetGrad", p, Float32Grad(grad))
}

// SetGrad16 is SetGrad for bfloat16 or float16 grads given as raw bits.
func (o *Optimizer) SetGrad16(p *Param, dtype DType, grad []uint16) error {
	switch dtype {
	case BFloat16:
		return o.setGrad("shardadam.SetGrad16", p, BFloat16Grad(grad))
	case Float16:
		return o.setGrad("shardadam.SetGrad16", p, Float16Grad(grad))
	}
	return bindingError(StatusInvalidArgument, "shardadam.SetGrad16: dtype %s is not bfloat16 or float16", dtype)
}

// Grad is one param's entry of SetGrads: its values in row-major order, as a Float32Grad,
// BFloat16Grad or Float16Grad. A nil Grad means "this param has no grad".
type Grad interface {
	values() (dtype DType, src unsafe.Pointer, count int64)
}

// Float32Grad is a float32 grad.
type Float32Grad []float32

// BFloat16Grad is a bfloat16 grad, as raw bits.
type BFloat16Grad []uint16

// Float16Grad is a float16 grad, as raw bits.
type Float16Grad []uint16

func (g Float32Grad) values() (DType, unsafe.Pointer, int64) {
	return Float32, firstElem([]float32(g)), int64(len(g))
}
func (g BFloat16Grad) values() (DType, unsafe.Pointer, int64) {
	return BFloat16, firstElem([]uint16(g)), int64(len(g))
}
func (g Float16Grad) values() (DType, unsafe.Pointer, int64) {
	return Float16, firstElem([]uint16(g)), int64(len(g))
}

// SetGrads binds the grads of every param in one call (sa_optimizer_set_grads): grads[i]
// for the param of index i, one entry per param; a nil entry means "this param has no
// grad" (steps skip it until a grad is bound again). Each grad is copied into its param's
// buffer and checked by the library as SetGrad is. All or nothing: on error no binding
// and no buffer changes, and the message names the first param that failed.
func (o *Optimizer) SetGrads(grads []Grad) error {
	const op = "shardadam.SetGrads"
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	entries := make([]int64, 5*len(grads)) // all "no grad" unless staged below
	var shapes []int64
	// A list of the wrong length goes to the library as it is: it refuses the count
	// before it reads any entry, and says what it expected.
	if len(grads) == len(o.params) {
		for i, g := range grads {
			if g == nil {
				continue
			}
			p := o.params[i]
			dtype, _, count := g.values()
			if err := o.stageGrad(op, p, count); err != nil {
				return err
			}
			code, bits, _ := dtype.dlpack()
			copy(entries[5*i:], []int64{1, int64(code), int64(bits), int64(uintptr(p.grad)), int64(len(p.Shape))})
			shapes = append(shapes, p.Shape...)
		}
	}
	if err := resultError(capi.Sago_set_grads(o.handle, entries, shapes, o.errbuf), o.errbuf); err != nil {
		return err
	}
	for i, g := range grads {
		if g != nil {
			copyGrad(o.params[i], g)
		}
	}
	return nil
}

// ClearGrad marks a param as having no grad (sa_optimizer_clear_grad): later steps skip
// it, leaving its values, state and step count as they are, until a grad is bound again.
func (o *Optimizer) ClearGrad(p *Param) error {
	const op = "shardadam.ClearGrad"
	if p == nil || p.opt != o {
		return bindingError(StatusInvalidArgument, "%s: the param does not belong to this optimizer", op)
	}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return resultError(capi.Sago_clear_grad(o.handle, p.Index, o.errbuf), o.errbuf)
}

func (o *Optimizer) setGrad(op string, p *Param, g Grad) error {
	if p == nil || p.opt != o {
		return bindingError(StatusInvalidArgument, "%s: the param does not belong to this optimizer", op)
	}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	dtype, _, count := g.values()
	if err := o.stageGrad(op, p, count); err != nil {
		return err
	}
	code, bits, _ := dtype.dlpack()
	// Bind first (the library validates), copy after: a refused grad changes nothing.
	status := capi.Sago_set_grad(o.handle, p.Index, code, bits, uintptr(p.grad), p.Shape, o.errbuf)
	if err := resultError(status, o.errbuf); err != nil {
		return err
	}
	copyGrad(p, g)
	return nil
}

// stageGrad makes sure p has its grad buffer and that a grad of count values fills it.
// The wrapper checks only what the library cannot see: that the slice holds one value per
// element, as the copy needs. The caller holds the lock.
func (o *Optimizer) stageGrad(op string, p *Param, count int64) error {
	if count != p.numel {
		return bindingError(StatusInvalidArgument, "%s: param '%s': grad has %d values, local shape %v needs %d", op, p.Name, count, p.Shape, p.numel)
	}
	if p.grad == nil {
		// Sized for float32, the widest grad dtype, so a rebind with another dtype fits.
		if p.grad = capi.Alloc(p.numel * Float32.size()); p.grad == nil {
			return bindingError(StatusOutOfMemory, "%s: param '%s': cannot allocate its grad buffer", op, p.Name)
		}
	}
	return nil
}

// copyGrad copies a grad the library accepted into p's buffer (staged by stageGrad).
func copyGrad(p *Param, g Grad) {
	dtype, src, count := g.values()
	if nbytes := count * dtype.size(); nbytes > 0 {
		copy(unsafe.Slice((*byte)(p.grad), nbytes), unsafe.Slice((*byte)(src), nbytes))
	}
}

// ---- per-param step counts -----------------------------------------------------------

// ParamSteps returns the step counts of the params of indices [first, first+n)
// (sa_optimizer_get_param_steps): the steps in which each had a grad and the step was not
// skipped, the count its bias correction uses (torch's state[p]["step"]).
func (o *Optimizer) ParamSteps(first, n int64) ([]int64, error) {
	if err := o.lock("shardadam.ParamSteps"); err != nil {
		return nil, err
	}
	defer o.mu.Unlock()
	steps := make([]int64, max64(n, 1)) // never empty: a bad n reaches the library's range check
	if err := resultError(capi.Sago_get_param_steps(o.handle, first, n, steps, o.errbuf), o.errbuf); err != nil {
		return nil, err
	}
	return steps[:n], nil
}

// SetParamSteps replaces the step counts of the params of indices
// [first, first+len(steps)) (sa_optimizer_set_param_steps; all checked first, nothing
// changes on error). Group step counts stay as they are.
func (o *Optimizer) SetParamSteps(first int64, steps []int64) error {
	if err := o.lock("shardadam.SetParamSteps"); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return resultError(capi.Sago_set_param_steps(o.handle, first, steps, o.errbuf), o.errbuf)
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// ---- step --------------------------------------------------------------------------

// StepArgs holds the options of StepWith (sa_step_args). The zero value is a plain step.
//
// With a communicator set (SetComm) a step with a norm or a found-inf flag is collective:
// every rank must call it, with the same MaxGradNorm and NormType, and with the found-inf
// flag handed over (FoundInf or ReduceFoundInf set) on all ranks or on none.
type StepArgs struct {
	// InvGradScale multiplies every grad before use (the inverse loss scale of mixed
	// precision training); 0 means 1.
	InvGradScale float32
	// FoundInf skips the whole step: no param, state or step count changes. With a
	// communicator the flags of all ranks are OR-reduced, so a flag on one rank skips the
	// step everywhere; then the other ranks set ReduceFoundInf.
	FoundInf bool
	// ReduceFoundInf hands the found-inf flag to the step even when FoundInf is false, so
	// that with a communicator every rank takes part in the found-inf consensus. A loss
	// scaler sets it on every rank at every step.
	ReduceFoundInf bool
	// MaxGradNorm 0 computes no norm. A bound > 0 makes the step compute the norm of all
	// grads of all ranks (after InvGradScale; a shard replicated along a mesh dim counts
	// once) and scale every grad by min(1, MaxGradNorm / (norm + 1e-6)) inside the update,
	// as torch.nn.utils.clip_grad_norm_ does; the grad buffers are not written.
	// math.Inf(1) measures without clipping. A non-finite norm skips the step on every
	// rank. Without a communicator the norm is this rank's own.
	MaxGradNorm float64
	// NormType is the norm MaxGradNorm bounds: NormL2 (the zero value) or NormInf.
	NormType NormType
}

// StepReport says what a step did.
type StepReport struct {
	// Skipped: a found-inf flag on some rank, or a non-finite norm. No param, state or step
	// count changed.
	Skipped bool
	// GradNorm is the global grad norm when StepArgs.MaxGradNorm asked for one (NaN or
	// infinite when a grad was; the step was then skipped), else 0. Every rank gets the
	// same bits.
	GradNorm float64
}

// Step runs one optimizer step over every param that has a grad, advancing its step count
// and each group's. Every non-empty param needs a grad bound (SetGrad, SetGrads) or to be
// marked as having none (ClearGrad, a nil entry of SetGrads) first (StatusState otherwise,
// naming the param, and nothing is updated).
func (o *Optimizer) Step() error {
	_, err := o.StepWith(StepArgs{})
	return err
}

// StepWith is Step with a loss scale, a found-inf flag and grad clipping (see StepArgs).
// It reports whether the step was skipped and the norm.
//
// A failing host communicator fails the step with StatusComm before anything changed on
// this rank; the message ends with the function's error (or its panic).
func (o *Optimizer) StepWith(args StepArgs) (StepReport, error) {
	if err := o.lock("shardadam.Step"); err != nil {
		return StepReport{}, err
	}
	defer o.mu.Unlock()
	var host *hostComm
	if o.comm != nil && o.comm.host != nil {
		host = o.comm.host
		host.takeError() // forget an earlier step's
	}
	foundInf := float32(0)
	if args.FoundInf {
		foundInf = 1
	}
	wasSkipped, norm := []int{0}, []float64{0}
	status := capi.Sago_step(o.handle, flag(args.InvGradScale != 0), args.InvGradScale,
		flag(args.FoundInf || args.ReduceFoundInf), foundInf, args.MaxGradNorm,
		int(args.NormType), norm, wasSkipped, o.errbuf)
	if err := resultError(status, o.errbuf); err != nil {
		if e := err.(*Error); e.Status == StatusComm && host != nil {
			if why := host.takeError(); why != "" {
				e.Message += ": " + why
			}
		}
		return StepReport{}, err
	}
	return StepReport{Skipped: wasSkipped[0] != 0, GradNorm: norm[0]}, nil
}

// ---- state -------------------------------------------------------------------------

// readState copies a state of p into the 4*numel bytes at dst (room for the widest state)
// and returns its dtype.
func (o *Optimizer) readState(op string, p *Param, key string, dst unsafe.Pointer) (DType, error) {
	if p == nil || p.opt != o {
		return DTypeDefault, bindingError(StatusInvalidArgument, "%s: the param does not belong to this optimizer", op)
	}
	var raw []byte
	if p.numel > 0 {
		raw = unsafe.Slice((*byte)(dst), 4*p.numel)
	}
	if err := o.lock(op); err != nil {
		return DTypeDefault, err
	}
	defer o.mu.Unlock()
	info := make([]int64, 3)
	if err := resultError(capi.Sago_state_read(o.handle, p.Index, key, raw, info, o.errbuf), o.errbuf); err != nil {
		return DTypeDefault, err
	}
	return dtypeFromDLPack(info[0], info[1]), nil
}

// paramNumel is p's element count, 0 for a nil p (readState then reports the bad param).
func paramNumel(p *Param) int64 {
	if p == nil {
		return 0
	}
	return p.numel
}

// firstElem points to values[0], or is nil for an empty slice.
func firstElem[T any](values []T) unsafe.Pointer {
	if len(values) == 0 {
		return nil
	}
	return unsafe.Pointer(&values[0])
}

// State returns a copy of one state of a param as float32 values: "exp_avg",
// "exp_avg_sq", "max_exp_avg_sq" (AMSGrad) or "master" (MasterFP32). bfloat16 moments
// are widened exactly. For the int16 "remainder" state use StateInt16.
func (o *Optimizer) State(p *Param, key string) ([]float32, error) {
	const op = "shardadam.State"
	values := make([]float32, paramNumel(p))
	dtype, err := o.readState(op, p, key, firstElem(values))
	if err != nil {
		return nil, err
	}
	switch dtype {
	case Float32:
		return values, nil
	case BFloat16:
		// The copy holds numel bfloat16s at the front of values: widen them from the back
		// so that no 16-bit value is overwritten before it is read.
		bits := unsafe.Slice((*uint16)(unsafe.Pointer(&values[0])), p.numel)
		for i := p.numel - 1; i >= 0; i-- {
			values[i] = BFloat16ToFloat32(bits[i])
		}
		return values, nil
	}
	return nil, bindingError(StatusUnsupported, "%s: param '%s': state '%s' is %s; use StateInt16", op, p.Name, key, dtype)
}

// StateInt16 returns a copy of the int16 "remainder" state (MasterRemainder) of a param.
func (o *Optimizer) StateInt16(p *Param, key string) ([]int16, error) {
	const op = "shardadam.StateInt16"
	values := make([]int16, 2*paramNumel(p)) // room for 4 bytes per element, the widest state
	dtype, err := o.readState(op, p, key, firstElem(values))
	if err != nil {
		return nil, err
	}
	if dtype != Int16 {
		return nil, bindingError(StatusMismatch, "%s: param '%s': state '%s' is %s, not int16; use State", op, p.Name, key, dtype)
	}
	return values[:p.numel], nil
}

// ---- shard files ---------------------------------------------------------------------

// Save writes this rank's state as one shard file at path (sa_optimizer_export): every
// param's states, the groups with their step counts, and where each shard sits in its
// global tensor. The file is a valid safetensors file. It is written to a temporary name,
// synced and renamed, so a crash never leaves a file that looks complete. A param
// replicated along a mesh dim is written only by the replica at coordinate 0.
func (o *Optimizer) Save(path string) error {
	const op = "shardadam.Save"
	if strings.IndexByte(path, 0) >= 0 {
		return bindingError(StatusInvalidArgument, "%s: path %q contains a NUL byte", op, path)
	}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return resultError(capi.Sago_save(o.handle, path, o.errbuf), o.errbuf)
}

// LoadOptions holds the options of Load (sa_import_options). The zero value gives the
// library's defaults.
type LoadOptions struct {
	AllowMissing    bool  // params absent from the files keep their state (else an error)
	AllowUnexpected bool  // params in the files that this optimizer lacks are ignored
	KeepGroups      bool  // keep the groups' hyperparameters and step counts (else restored)
	StagingBytes    int64 // bytes of the staging buffer; 0: the library's default (64 MiB)
}

// Load reads the state saved in the shard files at paths, written by any number of ranks
// with any layout, into this optimizer's state, resharding as needed
// (sa_optimizer_import). Everything is validated before anything changes: every saved box
// that meets a local one must cover it exactly once, shapes and dtypes must agree, and the
// checksums of every block read must match. Params themselves are not touched. opts may
// be nil.
func (o *Optimizer) Load(paths []string, opts *LoadOptions) error {
	const op = "shardadam.Load"
	if opts == nil {
		opts = &LoadOptions{}
	}
	joined, err := packStrings(op, "path", paths)
	if err != nil {
		return err
	}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	status := capi.Sago_load(o.handle, joined, flag(opts.AllowMissing), flag(opts.AllowUnexpected),
		flag(!opts.KeepGroups), opts.StagingBytes, o.errbuf)
	return resultError(status, o.errbuf)
}

// packStrings lays out a list of strings as the C helpers take one: each string followed by
// a NUL byte. A string holding a NUL byte would read as two: an error naming it as `what`.
func packStrings(op, what string, list []string) ([]byte, error) {
	var packed []byte
	for _, s := range list {
		if strings.IndexByte(s, 0) >= 0 {
			return nil, bindingError(StatusInvalidArgument, "%s: %s %q contains a NUL byte", op, what, s)
		}
		packed = append(append(packed, s...), 0)
	}
	return packed, nil
}
