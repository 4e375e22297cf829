// Package shardadam runs fused Adam/AdamW steps over the local shards of globally shaped
// params, through the shardadam C library (libshardadam.so), which it calls directly
// through cgo (shardadam.h).
//
// Params and grads live in memory the library may keep using between calls, so never in
// Go memory (the cgo pointer rules; the collector moves and frees it):
//
//   - AddParam / AddParam16 copy the initial values into host memory the optimizer
//     allocates in C and owns; Param.Float32 / Param.Bits16 view it without copying.
//   - AddParamTensor registers memory the caller owns and keeps alive: CUDA device memory
//     (a device address, device id, dtype and shape) or C host memory (a HostTensor).
//   - BindGrad / BindGrads bind a grad buffer once, zero-copy: the library checks its
//     dtype, shape and device at the binding, and every later Step reads it in place, so a
//     training loop writes the grads into the buffer and calls Step, with no copy and no
//     rebinding. HostGrad gives a param such a buffer in C host memory.
//   - SetGrad / SetGrads copy Go slices into a C buffer of the optimizer's and bind it:
//     convenient, at the price of a copy per call.
//
// A param may have no grad at a step (ClearGrad, a nil entry of SetGrads or BindGrads): it
// is then skipped, as torch skips a param whose .grad is None, and its own step count
// (ParamSteps) does not advance. States are copied out by State. Save and Load write and
// read shard files (one per rank; any set of them loads onto any layout). SaveAsync
// snapshots the state and writes the file on a library thread while training goes on;
// its ExportJob says when the file is in place (Wait, Done) and must be closed.
//
// On a CUDA optimizer (params on a CUDA device) Step and Flush take the caller's stream as
// a raw cudaStream_t (StepArgs.Stream; 0 is the legacy default stream) and only enqueue
// work on it, as shardadam.h says per function.
//
// A group's hyperparameters are a GroupConfig, a map from the library's field names to
// values, e.g. GroupConfig{"lr": 1e-2} (the fields it leaves out keep their defaults).
// GroupFields describes each field (default, valid values, doc) from the library's own
// table, so this package spells none of them and gets every field the library adds; the
// dtypes (DTypes) and the step arguments come from the library's tables too.
//
// A step can clip the grads by their global norm (StepArgs.MaxGradNorm). Each rank's
// optimizer holds its own shards, so the ranks agree on the norm through a Comm given to
// SetComm: NCCL for CUDA params, or a Go function over the caller's own transport
// (NewHostComm).
//
// Every failure is an *Error carrying the library's status and message (which names the
// function and the param). It is the failed call's own message whichever OS thread the
// goroutine runs on.
//
// An Optimizer may be used from several goroutines: its methods serialize on a mutex, as
// the library requires. Call Close when done; it frees the params' and grads' memory that
// the optimizer allocated, and the state.
//
// Building: the package finds the library with pkg-config (#cgo pkg-config: shardadam),
// so with the library installed a plain `go build` works; for an install in a prefix of
// your own, or a build tree, point PKG_CONFIG_PATH at its shardadam.pc:
//
//	export PKG_CONFIG_PATH=<prefix>/lib/pkgconfig   # a build tree: <build>/pkgconfig
//	export LD_LIBRARY_PATH=<prefix>/lib              # or link with an rpath
//	go test ./...
package shardadam

// #include <stdlib.h>
// #include <shardadam/shardadam.h>
import "C"

import (
	"strings"
	"sync"
	"unsafe"
)

// Version returns the version of the loaded library as MAJOR*10000 + MINOR*100 + PATCH.
func Version() int { return int(C.sa_version()) }

// BuildInfo returns the library's one-line description of its version and backends.
func BuildInfo() string { return C.GoString(C.sa_build_info()) }

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
	handle *C.sa_optimizer // nil once closed
	params []*Param
	device *Device    // of the first param (all params of an optimizer share it); nil before
	step   *stepBlock // the step's arguments, in C memory, allocated once
	comm   *Comm      // the last SetComm's, to read why a host communicator's function failed
	// partial holds the indices of a StepParams call, reused from call to call
	partial []int64
}

// NewOptimizer creates an empty optimizer. cfg may be nil (defaults).
func NewOptimizer(cfg *Config) (*Optimizer, error) {
	// The library's defaults (sa_struct_default), then the fields cfg sets.
	config := C.sa_optimizer_config{struct_size: C.sizeof_sa_optimizer_config}
	if err := handleless(func() C.sa_status {
		return C.sa_struct_default(C.SA_STRUCT_OPTIMIZER_CONFIG, unsafe.Pointer(&config))
	}); err != nil {
		return nil, err
	}
	if cfg != nil {
		config.num_threads = C.int32_t(cfg.NumThreads)
		if cfg.ScalarOnly {
			config.cpu_simd = 0
		}
	}
	step, err := newStepBlock()
	if err != nil {
		return nil, err
	}
	var handle *C.sa_optimizer
	if err := handleless(func() C.sa_status { return C.sa_optimizer_create(&config, &handle) }); err != nil {
		step.free()
		return nil, err
	}
	return &Optimizer{handle: handle, step: step}, nil
}

// Close destroys the optimizer: its state and the memory it allocated for params and
// grads (so every slice returned by Param.Float32 or Param.Bits16 of such a param becomes
// invalid). Memory registered by AddParamTensor or bound by BindGrad is the caller's again.
// Closing twice is a no-op. It always returns nil.
func (o *Optimizer) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.handle == nil {
		return nil
	}
	C.sa_optimizer_destroy(o.handle) // calls each param's DLPack deleter (sagoShardDeleter)
	o.handle = nil
	for _, p := range o.params {
		C.free(p.grad)
		p.grad, p.host = nil, nil
	}
	o.step.free()
	o.params, o.comm = nil, nil
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

// checkParam fails unless p is one of o's params.
func (o *Optimizer) checkParam(op string, p *Param) error {
	if p == nil || p.opt != o {
		return bindingError(StatusInvalidArgument, "%s: the param does not belong to this optimizer", op)
	}
	return nil
}

// checkNoNUL fails for a string that C would read as shorter than it is.
func checkNoNUL(op, what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return bindingError(StatusInvalidArgument, "%s: %s %q contains a NUL byte", op, what, s)
	}
	return nil
}

// pointerAt turns an address of memory that Go does not manage (C memory of the
// library's or the caller's, a CUDA stream handle) into the pointer cgo passes as void*.
// As an offset from nil: the address is none of Go's, and no local's address is taken
// (which would move it to the heap at every call).
func pointerAt(a uintptr) unsafe.Pointer { return unsafe.Add(unsafe.Pointer(nil), a) }

// ---- params ------------------------------------------------------------------------

// MasterKind says how a param keeps its full-precision value (sa_master_kind).
type MasterKind int

// The master kinds.
const (
	MasterAuto      MasterKind = C.SA_MASTER_AUTO      // none for float32 params, float32 master for 16-bit params
	MasterNone      MasterKind = C.SA_MASTER_NONE      // update the param in its own dtype (float32 params only)
	MasterFP32      MasterKind = C.SA_MASTER_FP32      // keep a float32 master copy; the param is its rounding
	MasterRemainder MasterKind = C.SA_MASTER_REMAINDER // bfloat16 params: keep the int16 low half of the float32
)

// StatePlacement says where a param's optimizer state (master, remainder, moments, block
// scales) lives (sa_state_placement). Shard files do not record it: a file saved from state
// in one placement loads into any other.
type StatePlacement int32

// The state placements.
const (
	// StateOnDevice: in the param's device memory (the default).
	StateOnDevice StatePlacement = C.SA_STATE_ON_DEVICE
	// StateOnHost: in pinned host memory the optimizer owns. A CUDA param's steps stream it
	// through a fixed device ring over the host link (the param and grad stay on the device),
	// so it takes no device memory of its own; its state views are host memory. A CPU param's
	// state is host memory already: the library resolves this to StateOnDevice.
	StateOnHost StatePlacement = C.SA_STATE_ON_HOST
	// StateOnHostCPUStep: in host memory the optimizer owns, stepped by the CPU
	// (ZeRO-Offload's scheme): each step a CUDA param's param and grad come down into a
	// fixed ring of pinned host buffers, the host's threads (Config.NumThreads) update the
	// state there, and the param goes back up, so no state byte crosses the host link. The
	// step's decision and coefficients are the device's: the results are bit for bit those
	// of the other placements. The step cannot be captured in a CUDA graph. An fp8 param's
	// master is updated on the host and its cast is the device's. A CPU param's state is
	// host memory already: the library resolves this to StateOnDevice.
	StateOnHostCPUStep StatePlacement = C.SA_STATE_ON_HOST_CPU_STEP
)

// Scaling says how an fp8 param (Float8E4M3FN, Float8E5M2) is cast from its float32 master
// after each update (sa_param_scaling; ParamScalings lists them as the library defines
// them, with their blocks and scale dtypes). The casts round to nearest even and saturate.
type Scaling int32

const (
	ScalingNone Scaling = C.SA_SCALING_NONE // not an fp8 param
	// ScalingDelayed: param = fp8(master * scale) with the engine's Scale (one float32,
	// read at every step); Amax (optional, one float32) receives max |master| of the shard.
	ScalingDelayed Scaling = C.SA_SCALING_DELAYED
	// ScalingMXFP8: a power-of-two scale per 32 elements of the last dim, which the step
	// writes into Scale as Float8E8M0FNU codes (the local shape, last dim / 32).
	ScalingMXFP8 Scaling = C.SA_SCALING_MXFP8
	// ScalingBlock128: a float32 scale_inv per 128 elements of the last dim, which the step
	// writes into Scale (the local shape, last dim / 128).
	ScalingBlock128 Scaling = C.SA_SCALING_BLOCK128
	// ScalingCurrent: per tensor, from the whole tensor's amax at every step (reduced across
	// the ranks through the optimizer's communicator when the layout shards it; set the
	// communicator first): the step writes Scale, two float32s [scale, scale_inv], with
	// scale = fp8_max / amax (divided by 2^ParamOptions.Margin); Amax (optional) receives
	// the amax.
	ScalingCurrent Scaling = C.SA_SCALING_CURRENT
	// ScalingCurrentPow2: as ScalingCurrent, the scale rounded down to a power of two.
	ScalingCurrentPow2 Scaling = C.SA_SCALING_CURRENT_POW2
)

// ParamOptions holds the per-param choices of AddParam. The zero value gives the defaults.
type ParamOptions struct {
	Layout      *Layout    // where the shard sits in its global tensor; nil: not sharded
	GradDType   DType      // Float32, BFloat16 or Float16; DTypeDefault: the param's dtype (float32 for fp8)
	MomentDType DType      // Float32 (DTypeDefault), BFloat16, Uint8 (8-bit blockwise) or Float8E4M3FN
	Master      MasterKind // how the full-precision value is kept
	// fp8 params (AddParamTensor with Float8E4M3FN or Float8E5M2): how the step casts the
	// master into the param (required for them), and the scale tensors it names, in memory
	// the caller keeps allocated until Close, as a param's (Tensor's rules). The master
	// starts as the param's value times its scale's inverse.
	Scaling Scaling
	Scale   *Tensor // the scale Scaling describes
	Amax    *Tensor // ScalingDelayed, ScalingCurrent and ScalingCurrentPow2 only, optional
	// ScalingCurrent and ScalingCurrentPow2 only: the scale is (fp8_max / amax) / 2^Margin,
	// so values up to 2^Margin * amax still fit before they saturate; 0 (the default) to 6
	// (the library refuses others, and a non-zero Margin for any other scaling).
	Margin int32
	// Where the param's state lives: StateOnDevice (the default), StateOnHost (pinned
	// host memory; when the host cannot pin it, the library refuses the param with
	// StatusOutOfMemory) or StateOnHostCPUStep (host memory the CPU steps). Other values are
	// refused with StatusInvalidArgument.
	StatePlacement StatePlacement
	// Fields sets more number fields of sa_param_options by their C names (the library's
	// table, sa_struct_field: StructFields(StructParamOptions) lists them), so that an option
	// of a newer library needs no new member here. The library checks them as it checks the
	// others; a name it does not know, or a field that is not a number, is refused with
	// StatusInvalidArgument. A field set both ways takes the value here.
	Fields map[string]float64
}

// Param is a registered local shard.
type Param struct {
	Index     int64   // the library's index of the param (0, 1, ... in order of addition)
	Name      string  // its fully qualified name
	DType     DType   // the dtype of the param's data
	GradDType DType   // the dtype its grads must have
	Shape     []int64 // the local shape
	Device    Device  // where its data lives

	opt   *Optimizer
	numel int64
	data  uintptr        // its data: the optimizer's C memory or the caller's (AddParamTensor)
	host  unsafe.Pointer // data when it is host memory, for Float32 and Bits16; nil once closed
	grad  unsafe.Pointer // C memory that SetGrad copies into; nil until the first SetGrad
}

// Numel returns the number of local elements.
func (p *Param) Numel() int64 { return p.numel }

// Tensor describes the param's data: where the library updates it in place at every step.
func (p *Param) Tensor() Tensor {
	return Tensor{Data: p.data, Device: p.Device, DType: p.DType, Shape: append([]int64(nil), p.Shape...)}
}

// Float32 returns the values of a float32 param in host memory as a slice over that
// memory, or nil (another dtype, device memory, a closed optimizer). Each Step updates
// them in place; writes change the param. The slice is valid until Close (or, for memory
// of the caller's, until it is freed), and must not be used while a Step runs in another
// goroutine.
func (p *Param) Float32() []float32 {
	if p.DType != Float32 || p.host == nil {
		return nil
	}
	return unsafe.Slice((*float32)(p.host), p.numel)
}

// Bits16 returns the raw bits of a bfloat16 or float16 param in host memory as a slice
// over that memory, or nil; the same rules as Float32 apply.
func (p *Param) Bits16() []uint16 {
	if (p.DType != BFloat16 && p.DType != Float16) || p.host == nil {
		return nil
	}
	return unsafe.Slice((*uint16)(p.host), p.numel)
}

// managedTensor is t as a DLManagedTensorVersioned in one C block with its shape, for the
// library to keep: its deleter frees the block and owned (the data the optimizer owns; nil
// for the caller's memory). nil when C memory runs out.
func managedTensor(t *Tensor, owned unsafe.Pointer) *C.DLManagedTensorVersioned {
	m := (*C.DLManagedTensorVersioned)(C.calloc(1, C.size_t(C.sizeof_DLManagedTensorVersioned+8*len(t.Shape))))
	if m == nil {
		return nil
	}
	m.version = C.DLPackVersion{major: C.DLPACK_MAJOR_VERSION, minor: C.DLPACK_MINOR_VERSION}
	m.manager_ctx = owned
	m.deleter = shardDeleter()
	t.fill(&m.dl_tensor, (*C.int64_t)(unsafe.Add(unsafe.Pointer(m), C.sizeof_DLManagedTensorVersioned)))
	return m
}

// Bytes returns the raw bytes of a param in host memory (an fp8 param's codes, say) as a
// slice over that memory, or nil; the same rules as Float32 apply.
func (p *Param) Bytes() []byte {
	if p.host == nil {
		return nil
	}
	return unsafe.Slice((*byte)(p.host), p.numel*p.DType.size())
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
// checkpoints match on) in `group`. shape is the local shape; init (copied into host
// memory the optimizer owns) holds its prod(shape) values in row-major order. opts may be
// nil.
func (o *Optimizer) AddParam(name string, group int, shape []int64, init []float32, opts *ParamOptions) (*Param, error) {
	return o.addCopiedParam("shardadam.AddParam", name, group, Float32, shape, firstElem(init), int64(len(init)), opts)
}

// AddParam16 registers a bfloat16 or float16 local shard from its raw bits (see
// Float32ToBFloat16); otherwise as AddParam. By default the optimizer keeps a float32
// master copy (MasterAuto).
func (o *Optimizer) AddParam16(name string, group int, dtype DType, shape []int64, init []uint16, opts *ParamOptions) (*Param, error) {
	if dtype != BFloat16 && dtype != Float16 {
		return nil, bindingError(StatusInvalidArgument, "shardadam.AddParam16: param '%s': dtype %s is not bfloat16 or float16", name, dtype)
	}
	return o.addCopiedParam("shardadam.AddParam16", name, group, dtype, shape, firstElem(init), int64(len(init)), opts)
}

// AddParamTensor registers the caller's memory as a local shard: CUDA device memory
// (t.Device CUDA(id); the library needs its CUDA backend, see BuildInfo) or host memory
// that Go does not manage (a HostTensor, pinned memory). The library updates it in place
// at every step; the caller keeps it allocated, of t's dtype and shape, until Close,
// which leaves it to the caller. All params of an optimizer are on one device. On CUDA
// this call synchronizes the device (it is setup). opts may be nil.
func (o *Optimizer) AddParamTensor(name string, group int, t Tensor, opts *ParamOptions) (*Param, error) {
	const op = "shardadam.AddParamTensor"
	if t.DType == DTypeDefault {
		return nil, bindingError(StatusInvalidArgument, "%s: param '%s': the tensor has no dtype", op, name)
	}
	numel, err := numelOf(op, name, t.Shape)
	if err != nil {
		return nil, err
	}
	return o.addParam(op, name, group, t, numel, nil, opts)
}

// addCopiedParam copies count values of dtype at src into host memory the optimizer owns
// and registers it.
func (o *Optimizer) addCopiedParam(op, name string, group int, dtype DType, shape []int64, src unsafe.Pointer, count int64, opts *ParamOptions) (*Param, error) {
	numel, err := numelOf(op, name, shape)
	if err != nil {
		return nil, err
	}
	if count != numel {
		return nil, bindingError(StatusInvalidArgument, "%s: param '%s': init has %d values, shape %v needs %d", op, name, count, shape, numel)
	}
	nbytes := numel * dtype.size()
	data := cAlloc(nbytes)
	if data == nil {
		return nil, bindingError(StatusOutOfMemory, "%s: param '%s': cannot allocate %d bytes", op, name, nbytes)
	}
	if nbytes > 0 {
		copy(unsafe.Slice((*byte)(data), nbytes), unsafe.Slice((*byte)(src), nbytes))
	}
	t := Tensor{Data: uintptr(data), Device: CPU(), DType: dtype, Shape: shape}
	p, err := o.addParam(op, name, group, t, numel, data, opts)
	if err != nil {
		C.free(data) // on failure the library did not take ownership
	}
	return p, err
}

// addParam registers t; owned is its data when the optimizer owns it (freed by the
// param's deleter at Close), else nil.
func (o *Optimizer) addParam(op, name string, group int, t Tensor, numel int64, owned unsafe.Pointer, opts *ParamOptions) (*Param, error) {
	if opts == nil {
		opts = &ParamOptions{}
	}
	if err := checkNoNUL(op, "param name", name); err != nil {
		return nil, err
	}
	if err := checkDTypes(op, t.DType, opts.GradDType, opts.MomentDType); err != nil {
		return nil, err
	}
	var mem cArena
	defer mem.free()
	var layout *C.sa_layout
	if opts.Layout != nil {
		var err error
		if layout, err = opts.Layout.cLayout(op, &mem); err != nil {
			return nil, err
		}
	}
	for _, extra := range []*Tensor{opts.Scale, opts.Amax} {
		if extra != nil {
			if err := checkDTypes(op, extra.DType); err != nil {
				return nil, err
			}
		}
	}
	options := C.sa_param_options{struct_size: C.sizeof_sa_param_options,
		grad_dtype: opts.GradDType.dlpackType(), moment_dtype: opts.MomentDType.dlpackType(),
		master: C.int32_t(opts.Master), scaling: C.int32_t(opts.Scaling),
		margin: C.int32_t(opts.Margin), state_placement: C.int32_t(opts.StatePlacement)}
	if err := setFields(op, StructParamOptions, unsafe.Pointer(&options), C.sizeof_sa_param_options, opts.Fields); err != nil {
		return nil, err
	}
	if err := o.lock(op); err != nil {
		return nil, err
	}
	defer o.mu.Unlock()

	// The DLPack structs the library keeps on success (the shard's, and the scale's and the
	// amax's of an fp8 param); on failure the caller keeps the tensors and the blocks are
	// freed here (no deleter is called).
	var blocks []*C.DLManagedTensorVersioned
	freeBlocks := func() {
		for _, b := range blocks {
			C.free(unsafe.Pointer(b))
		}
	}
	outOfMemory := false
	keep := func(t *Tensor, owned unsafe.Pointer) *C.DLManagedTensorVersioned {
		if t == nil {
			return nil
		}
		m := managedTensor(t, owned)
		if m == nil {
			outOfMemory = true
		} else {
			blocks = append(blocks, m)
		}
		return m
	}
	shard := keep(&t, owned)
	options.scale = keep(opts.Scale, nil)
	options.amax = keep(opts.Amax, nil)
	if outOfMemory {
		freeBlocks()
		return nil, bindingError(StatusOutOfMemory, "%s: param '%s': cannot allocate its DLPack structs", op, name)
	}
	cname := mem.str(name)
	index := C.int64_t(-1)
	if err := o.check(C.sa_optimizer_add_param(o.handle, cname, C.int32_t(group), shard, layout, &options, &index)); err != nil {
		freeBlocks()
		return nil, err
	}
	// The grad dtype as the library resolved it (its default is its own fact: the param's
	// dtype, float32 for an fp8 param).
	info, err := o.paramInfo(int64(index))
	if err != nil {
		panic("shardadam: reading the param just added: " + err.Error()) // a broken library
	}
	p := &Param{Index: int64(index), Name: name, DType: t.DType, GradDType: info.GradDType,
		Shape: append([]int64(nil), t.Shape...), Device: t.Device, opt: o, numel: numel, data: t.Data}
	if t.Device.Kind == KindCPU {
		p.host = pointerAt(t.Data)
	}
	if o.device == nil {
		o.device = &p.Device
	}
	o.params = append(o.params, p)
	return p, nil
}

// ParamInfo is what the optimizer knows about a param, as the library registered and
// resolved it (sa_param_info): defaults filled in, the layout resolved to a box.
type ParamInfo struct {
	Index        int64      // the library's index of the param
	Name         string     // its fully qualified name
	Group        int32      // the group it belongs to
	LocalShape   []int64    // the shape of this rank's shard
	GlobalShape  []int64    // the shape of the whole tensor (LocalShape when not sharded)
	GlobalOffset []int64    // where the shard starts in the whole tensor, one per dim
	Numel        int64      // the local elements
	DType        DType      // the dtype of the param's data
	GradDType    DType      // the dtype its grads must have
	MomentDType  DType      // the dtype its moments are stored in
	Master       MasterKind // how its full-precision value is kept (never MasterAuto)
	Device       Device     // where its data lives
	Scaling      Scaling    // how an fp8 param is cast from its master; ScalingNone for others
	Margin       int32      // the margin of a current scaling; 0 otherwise
	// where its state lives, as the library resolved it (CPU params: StateOnDevice)
	StatePlacement StatePlacement
}

// Info returns what the optimizer knows about the param (sa_optimizer_param_info).
// StatusState once its optimizer is closed.
func (p *Param) Info() (ParamInfo, error) {
	const op = "shardadam.Param.Info"
	if p == nil || p.opt == nil {
		return ParamInfo{}, bindingError(StatusInvalidArgument, "%s: the param was not returned by an optimizer", op)
	}
	o := p.opt
	if err := o.lock(op); err != nil {
		return ParamInfo{}, err
	}
	defer o.mu.Unlock()
	return o.paramInfo(p.Index)
}

// paramInfo reads the param of index from the library, its arrays and name copied out of
// the optimizer's memory (which Close frees). The caller holds the lock.
func (o *Optimizer) paramInfo(index int64) (ParamInfo, error) {
	info := C.sa_param_info{struct_size: C.sizeof_sa_param_info}
	if err := o.check(C.sa_optimizer_param_info(o.handle, C.int64_t(index), &info)); err != nil {
		return ParamInfo{}, err
	}
	ndim := int(info.ndim)
	dims := func(a *C.int64_t) []int64 {
		if ndim == 0 {
			return []int64{}
		}
		return append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(a)), ndim)...)
	}
	dtype := func(d C.DLDataType) DType { return dtypeOfDLPack(int(d.code), int(d.bits)) }
	return ParamInfo{Index: index, Name: C.GoString(info.name), Group: int32(info.group),
		LocalShape: dims(info.local_shape), GlobalShape: dims(info.global_shape),
		GlobalOffset: dims(info.global_offset), Numel: int64(info.numel),
		DType: dtype(info.param_dtype), GradDType: dtype(info.grad_dtype), MomentDType: dtype(info.moment_dtype),
		Master:  MasterKind(info.master),
		Device:  Device{Kind: DeviceKind(info.device.device_type), ID: int(info.device.device_id)},
		Scaling: Scaling(info.scaling), Margin: int32(info.margin),
		StatePlacement: StatePlacement(info.state_placement)}, nil
}

// firstElem points to values[0], or is nil for an empty slice.
func firstElem[T any](values []T) unsafe.Pointer {
	if len(values) == 0 {
		return nil
	}
	return unsafe.Pointer(&values[0])
}

// ---- grads -------------------------------------------------------------------------
//
// A param either has a grad at the next steps or has none: steps then skip it (its values,
// state and step count stay, as torch skips a param whose .grad is None). A param given
// neither since it was added fails the step with StatusState. Every binding is checked by
// the library (sa_optimizer_set_grad, sa_optimizer_set_grads) and stays until replaced;
// the package never hands pointers to sa_optimizer_set_grad_ptrs, the C fast path that
// trusts its caller.

// BindGrad binds grad as the param's grad for every later Step, zero-copy, until the
// next binding or ClearGrad (sa_optimizer_set_grad): each step reads the grad memory in
// place, so a training loop writes new grads there before each Step. The library checks
// dtype (the param's GradDType), shape (its local shape) and device (the optimizer's);
// StatusMismatch naming the param otherwise, and the previous binding stays. The caller
// keeps the memory allocated and sized while it is bound; on CUDA it must hold the step's
// grads when the stream reaches the step.
func (o *Optimizer) BindGrad(p *Param, grad Tensor) error {
	const op = "shardadam.BindGrad"
	if err := o.checkParam(op, p); err != nil {
		return err
	}
	var mem cArena
	defer mem.free()
	dl, err := grad.cTensor(op, &mem)
	if err != nil {
		return err
	}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return o.check(C.sa_optimizer_set_grad(o.handle, C.int64_t(p.Index), dl))
}

// BindGrads binds the grads of every param in one call (sa_optimizer_set_grads): grads[i]
// for the param of index i, one entry per param; a nil entry means "this param has no
// grad". Each is checked and kept as BindGrad keeps it. All or nothing: on error no
// binding changes, and the message names the first param that failed.
func (o *Optimizer) BindGrads(grads []*Tensor) error {
	const op = "shardadam.BindGrads"
	var mem cArena
	defer mem.free()
	list, err := cTensorList(op, &mem, grads)
	if err != nil {
		return err
	}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return o.check(C.sa_optimizer_set_grads(o.handle, C.int64_t(len(grads)), list))
}

// cTensorList lays tensors out as sa_optimizer_set_grads takes them, in C memory (a list
// of pointers to DLTensors); nil entries stay NULL.
func cTensorList(op string, mem *cArena, tensors []*Tensor) (**C.DLTensor, error) {
	list := unsafe.Slice((**C.DLTensor)(mem.alloc(uintptr(len(tensors))*unsafe.Sizeof((*C.DLTensor)(nil)))), len(tensors))
	for i, t := range tensors {
		if t == nil {
			continue
		}
		dl, err := t.cTensor(op, mem)
		if err != nil {
			return nil, err
		}
		list[i] = dl
	}
	if len(list) == 0 {
		return nil, nil
	}
	return &list[0], nil
}

// HostGrad gives a param in host memory a grad buffer of its GradDType in C memory that
// the optimizer owns, binds it (BindGrad) and returns a view of it: write each step's
// grads into HostTensor.Float32 (or Bits16) and call Step, with no copy and no rebinding.
// It is the buffer SetGrad copies into, so SetGrad overwrites it. Valid until Close; do
// not Free it.
func (o *Optimizer) HostGrad(p *Param) (*HostTensor, error) {
	const op = "shardadam.HostGrad"
	if err := o.checkParam(op, p); err != nil {
		return nil, err
	}
	if err := o.lock(op); err != nil {
		return nil, err
	}
	defer o.mu.Unlock()
	if p.Device.Kind != KindCPU {
		return nil, bindingError(StatusMismatch, "%s: param '%s' is in %s memory; bind a grad there with BindGrad", op, p.Name, p.Device)
	}
	if err := o.stageGrad(op, p, p.numel); err != nil {
		return nil, err
	}
	grad := Tensor{Data: uintptr(p.grad), Device: CPU(), DType: p.GradDType, Shape: p.Shape}
	var mem cArena
	defer mem.free()
	dl, err := grad.cTensor(op, &mem)
	if err != nil {
		return nil, err
	}
	if err := o.check(C.sa_optimizer_set_grad(o.handle, C.int64_t(p.Index), dl)); err != nil {
		return nil, err
	}
	// A view, not an owner: the optimizer frees the buffer at Close.
	return &HostTensor{data: p.grad, dtype: p.GradDType, shape: append([]int64(nil), p.Shape...), numel: p.numel, view: true}, nil
}

// SetGrad copies float32 grads into the param's grad buffer (the one HostGrad returns)
// and binds it for every later Step until the next binding: a copy per call, for
// convenience; a training loop that writes its grads into the buffer (HostGrad) or binds
// its own (BindGrad) once saves it. The library checks the dtype against the registered
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
	tensors := make([]*Tensor, len(grads)) // all "no grad" unless staged below
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
			tensors[i] = &Tensor{Data: uintptr(p.grad), Device: CPU(), DType: dtype, Shape: p.Shape}
		}
	}
	var mem cArena
	defer mem.free()
	list, err := cTensorList(op, &mem, tensors)
	if err != nil {
		return err
	}
	if err := o.check(C.sa_optimizer_set_grads(o.handle, C.int64_t(len(grads)), list)); err != nil {
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
	if err := o.checkParam(op, p); err != nil {
		return err
	}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return o.check(C.sa_optimizer_clear_grad(o.handle, C.int64_t(p.Index)))
}

func (o *Optimizer) setGrad(op string, p *Param, g Grad) error {
	if err := o.checkParam(op, p); err != nil {
		return err
	}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	dtype, _, count := g.values()
	if err := o.stageGrad(op, p, count); err != nil {
		return err
	}
	var mem cArena
	defer mem.free()
	grad := Tensor{Data: uintptr(p.grad), Device: CPU(), DType: dtype, Shape: p.Shape}
	dl, err := grad.cTensor(op, &mem)
	if err != nil {
		return err
	}
	// Bind first (the library validates), copy after: a refused grad changes nothing.
	if err := o.check(C.sa_optimizer_set_grad(o.handle, C.int64_t(p.Index), dl)); err != nil {
		return err
	}
	copyGrad(p, g)
	return nil
}

// stageGrad makes sure p has its host grad buffer and that a grad of count values fills
// it. The wrapper checks only what the library cannot see: that the slice holds one value
// per element, as the copy needs. The caller holds the lock.
func (o *Optimizer) stageGrad(op string, p *Param, count int64) error {
	if count != p.numel {
		return bindingError(StatusInvalidArgument, "%s: param '%s': grad has %d values, local shape %v needs %d", op, p.Name, count, p.Shape, p.numel)
	}
	if p.grad == nil {
		// Sized for float32, the widest grad dtype, so a rebind with another dtype fits.
		if p.grad = cAlloc(p.numel * Float32.size()); p.grad == nil {
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
	if err := o.check(C.sa_optimizer_get_param_steps(o.handle, C.int64_t(first), C.int64_t(n), (*C.int64_t)(&steps[0]))); err != nil {
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
	return o.check(C.sa_optimizer_set_param_steps(o.handle, C.int64_t(first), C.int64_t(len(steps)), (*C.int64_t)(firstElem(steps))))
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}
