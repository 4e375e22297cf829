"""FusedAdam: torch.optim.Optimizer over shardadam (imported lazily by shardadam.torch)."""
import contextlib
import copy
import functools
import gc
from itertools import chain

import torch
from torch.utils.dlpack import to_dlpack

from . import _grad_intake, _schema
from ._comm import Comm, nccl_unique_id
from ._dlpack import BLOCK_MOMENT_DTYPES, SCALED_PARAM_DTYPES, dtype_name, to_dtype
from ._errors import InvalidArgument, check
from ._optimizer import Optimizer, _clip_args
from .layout import Mesh, Replicate, Shard

try:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Replicate as _TorchReplicate
    from torch.distributed.tensor import Shard as _TorchShard
except ImportError:  # torch built without distributed
    DTensor = _TorchReplicate = _TorchShard = None

from . import _torch_state_dict  # noqa: E402 (it reads this module's helpers at call time)

_DEFAULTS = _schema.defaults()  # the library's: torch.optim.AdamW's


def _adamw_group():
    """The keys and default values of a ``torch.optim.AdamW`` param group, read off a real
    one (torch's own, never retyped here)."""
    group = torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).param_groups[0]
    return {key: value for key, value in group.items() if key != "params"}


_ADAMW_GROUP = _adamw_group()
#: torch's implementation choices: the keys of AdamW's groups that are not hyperparameters
#: of the library (foreach, fused, capturable, differentiable), with AdamW's defaults.
#: FusedAdam's groups hold them too, so that checkpoints of either optimizer load into the
#: other through every path that matches group keys (DCP, flattened state dicts).
IMPLEMENTATION_DEFAULTS = {key: value for key, value in _ADAMW_GROUP.items() if key not in _schema.KEYS}
# FusedAdam's own hyperparameters (bias_correction): a group holds one only once it is set,
# so that FusedAdam's groups at its defaults have exactly AdamW's keys.
_OWN_KEYS = tuple(key for key in _schema.KEYS if key not in _ADAMW_GROUP)

# What each implementation choice may be in a FusedAdam, and why: FusedAdam has one
# implementation, a fused step over every param. A key torch adds later takes its default only.
_IMPLEMENTATION_RULES = {
    "foreach": ((None, False, True), "FusedAdam has one implementation, a fused multi-tensor step, whatever "
                "torch's foreach would choose between; the math is AdamW's either way"),
    "fused": ((None, True), "FusedAdam's step is always fused; for torch's unfused step use torch.optim.AdamW"),
    "capturable": ((False,), "FusedAdam's Python step reads every p.grad on the host, so it cannot be captured "
                   "in a CUDA graph"),
    "differentiable": ((False,), "FusedAdam's step runs outside autograd"),
}


def _check_implementation(values, where):
    """Raises ValueError naming the key unless each of torch's implementation keys in
    ``values`` (a dict) holds a value that means what FusedAdam does."""
    for key in IMPLEMENTATION_DEFAULTS.keys() & values.keys():
        allowed, why = _IMPLEMENTATION_RULES.get(key, ((IMPLEMENTATION_DEFAULTS[key],), "torch's default only"))
        value = values[key]
        if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
            raise ValueError(f"{where}: {key}={value!r} is not supported; {key} may be "
                             f"{' or '.join(map(repr, allowed))}: {why}")


def set_group_hyperparameters(group, hyperparameters):
    """Writes the library's hyperparameters into a torch param group, leaving out a
    FusedAdam-only key (bias_correction) that the group lacks and that is at its default."""
    for key, value in hyperparameters.items():
        if key in _OWN_KEYS and key not in group and value == _DEFAULTS[key]:
            continue
        group[key] = value


# The torch dtypes of the library's fp8 params (SA_DTYPE_SCALED_PARAM), from its table.
_FP8_DTYPES = frozenset(getattr(torch, name) for name in SCALED_PARAM_DTYPES
                        if isinstance(getattr(torch, name, None), torch.dtype))
# The scalings whose scale is the whole tensor's amax (sa_param_scaling's current ones).
_CURRENT_SCALINGS = ("current", "current_pow2")
# FusedAdam's offload= values and the state placement (Optimizer.add_param) each gives.
_OFFLOADS = {None: None, "host": "host", "cpu": "host_cpu_step"}


def _splits_across_ranks(param):
    """Whether a DTensor param is sharded along a mesh dim of more than one rank."""
    if DTensor is None or not isinstance(param, DTensor):
        return False
    return any(p.is_shard() and size > 1 for p, size in zip(param.placements, param.device_mesh.shape))


class Fp8:
    """How :class:`FusedAdam` casts one float8 param from its float32 master (an fp8 param:
    ``torch.float8_e4m3fn`` or ``torch.float8_e5m2`` data, given in ``FusedAdam(fp8=...)``).

    Args:
        scaling: ``"delayed"``, ``"mxfp8"``, ``"block128"``, ``"current"`` or ``"current_pow2"``
            (:func:`shardadam.param_scalings`; ``sa_param_scaling`` in ``shardadam.h`` states
            each rule; a sharded current one needs the optimizer's communicator).
        scale: the scale tensor on the param's device (a DTensor: its local tensor is used):
            ``"delayed"``: one float32 element that every step reads (``param =
            fp8(master * scale)``); ``"mxfp8"``: ``torch.float8_e8m0fnu`` of the local shape
            with the last dim / 32, written by every step; ``"block128"``: float32 of the
            local shape with the last dim / 128, written by every step with each block's
            scale_inv (what a forward pass multiplies by); ``"current"``: two float32
            elements ``[scale, scale_inv]``, written by every step.
        amax: ``"delayed"`` / ``"current"`` only, optional: a float32 tensor of one element
            that every step overwrites with max |master| (delayed: of this rank's shard;
            current: of the whole tensor).
        margin: ``"current"`` / ``"current_pow2"`` only: the scale is divided by
            ``2**margin`` (Transformer Engine's margin), 0 (the default) to 6.

    A Transformer Engine ``Float8Tensor`` adapter passes its data and scale tensors here.
    """

    __slots__ = ("scaling", "scale", "amax", "margin")

    def __init__(self, scaling, scale, amax=None, margin=0):
        self.scaling, self.scale, self.amax, self.margin = scaling, scale, amax, margin

    def __repr__(self):
        return (f"Fp8({self.scaling!r}, scale={tuple(self.scale.shape)}, amax={self.amax is not None}, "
                f"margin={self.margin})")


class _Entry:
    """One registered param: the torch param, its native index and where it sits
    (``local_shape`` and ``global_offset`` are read from the library when first used: a
    param_info per param would cost more than the registration itself)."""

    __slots__ = ("param", "index", "name", "group", "local_ptr", "numel", "sixteen_bit", "fp8", "mesh",
                 "placements", "_native", "_box")

    def __init__(self, param, index, name, group, local, mesh, placements, native):
        self.param, self.index, self.name, self.group = param, index, name, group
        self.local_ptr = local.data_ptr()
        self.numel = local.numel()
        self.sixteen_bit = local.element_size() == 2  # a master rounded to the param, or a remainder
        self.fp8 = local.dtype in _FP8_DTYPES  # a master cast by its scaling
        self.mesh, self.placements = mesh, placements
        self._native, self._box = native, None

    def _read_box(self):
        if self._box is None:
            info = self._native.param_info(self.index)
            self._box = (info.local_shape, info.global_offset)
        return self._box

    @property
    def local_shape(self):
        """The local shape, as the library registered it."""
        return self._read_box()[0]

    @property
    def global_offset(self):
        """Where the local shard starts in the global tensor."""
        return self._read_box()[1]


def _local_tensor(tensor):
    """The local shard of a DTensor (the tensor itself otherwise), without autograd."""
    if DTensor is not None and isinstance(tensor, DTensor):
        local = getattr(tensor, "_local_tensor", None)
        return local if local is not None else tensor.to_local()
    return tensor


def _placement(placement, name):
    # _StridedShard (FSDP2 over tensor parallelism) is a Shard with a split_factor: its split
    # is not torch.chunk's, so it is refused rather than misread.
    if placement.is_shard() and not hasattr(placement, "split_factor"):
        return Shard(placement.dim)
    if placement.is_replicate():
        return Replicate()
    if placement.is_partial():
        raise ValueError(f"FusedAdam: param {name!r} has a Partial placement; a param must be Shard or Replicate")
    raise ValueError(f"FusedAdam: param {name!r} has placement {placement!r}; shardadam supports Shard(d) "
                     "(torch.chunk's split) and Replicate()")


def _non_contiguous_advice(name, local):
    """Why a param whose memory is not C-contiguous (channels_last, a transposed view) is
    refused, and a fix that keeps the Parameter the model trains."""
    layout = "channels_last" if local.dim() == 4 and local.is_contiguous(memory_format=torch.channels_last) else \
        "not C-contiguous"
    return (f"FusedAdam: param {name!r} of shape {tuple(local.shape)} has strides {tuple(local.stride())} "
            f"({layout}); shardadam updates params in place and needs C-contiguous memory. Make the model's own "
            "params contiguous before building the optimizer: model.to(memory_format=torch.contiguous_format), "
            "or `with torch.no_grad(): p.data = p.data.contiguous()` per param. Both keep each Parameter object "
            "in the model (p.contiguous() would give a copy that the model does not train).")


def _hyperparameters(group):
    """A torch param group's hyperparameters in the library's keys and types."""
    lr = group["lr"]
    if isinstance(lr, torch.Tensor):
        lr = lr.item()  # a device lr synchronizes here; keep lr a float for a sync-free step
    return {key: _schema.coerce(key, lr if key == "lr" else group.get(key, _DEFAULTS[key])) for key in _schema.KEYS}


_no_subclass_torch_function = torch._C.DisableTorchFunctionSubclass
_PLAIN_NUMBERS = (float, int, bool, type(None))  # hyperparameter values that cannot change in place

try:  # the step hooks every torch optimizer runs (register_optimizer_step_pre_hook and post)
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
    _profiler_enabled = torch._C._autograd._profiler_enabled
    _grad_enabled, _set_grad_enabled = torch._C.is_grad_enabled, torch._C._set_grad_enabled
except (ImportError, AttributeError):  # another torch: its own wrapper (profile_hook_step) hooks step
    _global_optimizer_pre_hooks = _global_optimizer_post_hooks = _profiler_enabled = None


def _hooked_step(func):
    """FusedAdam.step as torch's ``Optimizer.profile_hook_step`` wraps every optimizer's step:
    the global and the optimizer's own step pre-hooks (which may replace the arguments),
    the step with autograd's grad mode off (as torch's steps run), ``_optimizer_step_code``
    (the profiler's Python-tracing entry), the post-hooks; under torch.compile all of it
    opaque to Dynamo (a graph break: it runs eagerly).

    Two costs of torch's wrapper are left out, the same behaviour kept: its profiler range
    (``record_function``) opens only while a profiler records, and the torch.compile guard
    (``torch.compiler.disable``, an eval-frame switch at every call) only while Dynamo
    traces. Together they were ~40% of the Python around the native step (cProfile, 1,516
    params, bench/python_host_step.py --profile). Where torch lacks what this needs, torch's
    own wrapper hooks the step instead.

    The grad mode is set and restored directly (what ``torch.no_grad()`` does), not through
    its decorator, whose objects and calls were 1.8 of the 6.1 us the Python around the
    native calls cost (16 params, a 2-core VM)."""
    if _profiler_enabled is None:
        return torch.compiler.disable(torch.no_grad()(func))

    def run(*args, **kwargs):
        self = args[0]
        for pre_hook in chain(_global_optimizer_pre_hooks.values(), self._optimizer_step_pre_hooks.values()):
            result = pre_hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(f"{func} must return None or a tuple of (new_args, new_kwargs), but got "
                                       f"{result}.")
                args, kwargs = result
        enabled = _grad_enabled()
        _set_grad_enabled(False)
        try:
            out = func(*args, **kwargs)
        finally:
            _set_grad_enabled(enabled)
        self._optimizer_step_code()
        for post_hook in chain(self._optimizer_step_post_hooks.values(), _global_optimizer_post_hooks.values()):
            post_hook(self, args, kwargs)
        return out

    opaque = torch.compiler.disable(run)

    @functools.wraps(func)
    def step(*args, **kwargs):
        if torch.compiler.is_compiling():
            return opaque(*args, **kwargs)
        if _profiler_enabled():
            with torch.autograd.profiler.record_function(f"Optimizer.step#{type(args[0]).__name__}.step"):
                return run(*args, **kwargs)
        return run(*args, **kwargs)

    step.hooked = True  # torch's Optimizer.__init__ then leaves it as it is
    return step


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Pauses Python's cyclic garbage collector (if enabled) for a bulk registration.

    Registering allocates a few objects per param, none in a cycle, and the collections
    they trigger traverse the young objects and, now and then, every tracked object (the
    model's tensors too): measured 0.4 s of 1.3 s for 100k params. Nothing is leaked: the
    collector runs again as usual afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# The current stream's cudaStream_t of a device index, without the torch.cuda.Stream object
# torch.cuda.current_stream() makes (~10 us of a step's host time); torch's own when it has it.
_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


def _current_stream(device):
    """The cudaStream_t (an int) of `device`'s current stream; None for a CPU device."""
    if device.type != "cuda":
        return None
    return _raw_current_stream(device.index if device.index is not None else torch.cuda.current_device())


class _ProcessGroupAllReduce:
    """A host communicator's all_reduce (and all_to_all) over a torch.distributed process
    group (gloo for CPU params): the doubles go through float64 CPU tensors.

    The default group is looked up at each call, not kept: the optimizer must not keep a
    group alive after ``destroy_process_group()`` (a gloo group freed at the interpreter's
    exit aborts the process).

    The tensors are kept, one per length, for as long as the communicator: gloo's worker
    thread may drop its last reference to a collective's work (a later ``barrier()`` holds
    the work still in flight) after ``all_reduce`` returned. Had the tensor's Python object
    died by then, torch would have handed it to the tensor, and that drop would take the
    GIL on gloo's thread; at the interpreter's exit that thread is then ended inside a
    destructor, and the process aborts ("terminate called without an active exception":
    4 runs in 44 of tests/test_torch_muon_fsdp2.py's save phase left to exit normally, 3 in
    100 with the tensors kept, the rest from tensors torch itself makes)."""

    def __init__(self, group):
        import torch.distributed as dist
        self.group = None if group is dist.group.WORLD else group
        self._tensors = {}  # length -> float64 tensor (see above)

    def _tensor(self, length, use, dtype=torch.float64):
        tensor = self._tensors.get((length, use))
        if tensor is None:
            tensor = self._tensors[(length, use)] = torch.empty(length, dtype=dtype)
        return tensor

    def __call__(self, values, op):
        import torch.distributed as dist
        tensor = self._tensor(len(values), "reduce")
        staged = tensor.numpy()
        staged[:] = values
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=self.group)
        values[:] = staged

    def all_to_all(self, send, send_bytes, recv, recv_bytes):
        """The communicator's all_to_all (the split Muon matrices' parts), through
        ``all_to_all_single`` of uint8 CPU tensors."""
        import torch.distributed as dist
        out = self._tensor(len(send), "send", torch.uint8)
        into = self._tensor(len(recv), "recv", torch.uint8)
        out.numpy()[:] = send
        dist.all_to_all_single(into, out, output_split_sizes=list(recv_bytes),
                               input_split_sizes=list(send_bytes), group=self.group)
        recv[:] = into.numpy()


def _distributed_group(process_group):
    """The process group to reduce over, or None when the job is a single rank."""
    if process_group is None:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return None
        process_group = dist.group.WORLD
    import torch.distributed as dist
    return process_group if dist.get_world_size(process_group) > 1 else None


def _make_comm(group, device):
    """A shardadam.Comm over `group` (collective: every rank of the group calls it):
    NCCL on the params' CUDA device (its unique id broadcast from the group's rank 0), a
    host communicator over torch.distributed otherwise."""
    import torch.distributed as dist
    rank, nranks = dist.get_rank(group), dist.get_world_size(group)
    if device.type != "cuda":
        collectives = _ProcessGroupAllReduce(group)
        return Comm(collectives, rank=rank, nranks=nranks, all_to_all=collectives.all_to_all)
    uid = [nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=dist.get_global_rank(group, 0), group=group, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return Comm.nccl(uid[0], nranks, rank, index)


class FusedAdam(torch.optim.Optimizer):
    """Adam/AdamW over shardadam: one native call per step, whatever the number of params.

    A drop-in ``torch.optim.Optimizer`` with ``torch.optim.AdamW``'s defaults (set
    ``decoupled_weight_decay=False`` for ``torch.optim.Adam``'s L2 weight decay).

    - **DTensor params** (FSDP2 ``fully_shard``, tensor parallelism) are registered once from
      their local tensor, device mesh, this rank's mesh coordinate and placements
      (``Shard(d)``, ``Replicate()``; ``Partial`` is refused). Plain tensors are unsharded.
      The optimizer state knows each shard's place in the global tensor.
    - **step()** hands every param's ``p.grad`` (its local tensor for DTensor grads) to the
      library in one native call, then steps in another. Every step checks every grad
      (dtype, device, shape, C-contiguous strides: no expanded, transposed, overlapping or
      too small grad is read) and refuses a bad one with an error naming the param, before
      anything changes. A param whose ``.grad`` is None is skipped, as torch skips it
      (unused embeddings, frozen layers, experts without tokens): its values and state stay
      and its own step count (bias correction) does not advance; a step where no param has
      a grad does nothing. Each group's current ``lr``, ``betas``, ``eps``,
      ``weight_decay`` (and flags) are honoured every step: LR schedulers work; changes are
      pushed to the library only when they change. ``torch.compile`` of a function that
      calls ``step()`` breaks the graph around the step, which runs eagerly.
    - **torch.amp.GradScaler**: the fused-optimizer protocol. The scaler hands over
      ``grad_scale`` and ``found_inf`` tensors (as attributes, or ``step(grad_scale=...,
      found_inf=...)``); the grads are unscaled inside the step with ``1 / grad_scale``
      computed on the device, and a nonzero ``found_inf`` skips the step on the device: no
      host synchronization. Across ranks (see below) ``found_inf`` on any rank skips the
      step on every rank. (``GradScaler.update()`` still reads this rank's ``found_inf``
      only: keep the scales equal across ranks as you would without FusedAdam, e.g. with
      ``ShardedGradScaler``.)
    - **Gradient clipping** (``max_grad_norm``): the step computes the norm of all grads of
      all ranks (after unscaling; a DTensor shard replicated along a mesh dim counts once)
      and scales the update by ``min(1, max_grad_norm / (norm + 1e-6))``, as
      ``torch.nn.utils.clip_grad_norm_`` before ``step()`` would, without a host sync and
      without writing the grads. ``self.grad_norm`` is that norm, a 0-dim float32 tensor
      on the params' device (new each step, like ``clip_grad_norm_``'s result). A
      non-finite norm skips the step on every rank. When torch.distributed is initialized
      with more than one rank, the first step that needs it (clipping or ``found_inf``)
      creates a communicator over ``process_group`` (default: the whole world), a
      collective call: an NCCL communicator for CUDA params (its own, from a unique id that
      rank 0 broadcasts), ``torch.distributed.all_reduce`` on the CPU for CPU params (gloo).
      Every rank then has to step with the same ``max_grad_norm`` and ``norm_type``.
      Plain (non-DTensor) params count on every rank.
    - **state_dict()** holds the states (``exp_avg``, ``exp_avg_sq``, and ``max_exp_avg_sq``,
      ``master``, ``remainder`` where they exist) as tensors sharing memory with the library's
      buffers: DTensors with their param's mesh and placements, so
      ``torch.distributed.checkpoint`` saves and reshards them; ``step`` per param as torch's
      Adam keeps it. **load_state_dict()** copies into the existing buffers (from DTensors
      of any layout, or plain local or global tensors).
    - Params must be C-contiguous (the library updates their memory in place as a flat
      array): a ``channels_last`` or otherwise permuted param is refused with the advice to
      make the model's own params contiguous (``model.to(memory_format=torch.contiguous_format)``),
      which keeps the Parameter objects in the model.
    - The params must keep their memory: the library updates the tensors it was given. A
      param whose local tensor was reallocated before the first step (e.g. FSDP2's lazy
      init re-padding it) is re-registered at that step; after the first step, reassigning
      ``p.data`` is not seen. Loading model weights before the first step is fine: fp32
      master weights are refreshed from the params at the first step.

    Args:
        params: iterable of params or of param groups (dicts), or of ``(name, param)`` pairs.
        lr, betas, eps, weight_decay: as in ``torch.optim.AdamW``.
        decoupled_weight_decay: True: AdamW; False: Adam with an L2 term on the grad.
        amsgrad, maximize: as in ``torch.optim.Adam``.
        bias_correction: divide by ``1 - beta^t`` (default True).
        master: for 16-bit params: None (fp32 master weights for bf16/fp16 params), ``"fp32"``,
            ``"remainder"`` (bf16 params: an int16 remainder instead of an fp32 copy).
        grad_dtype: dtype of the grads (default: the param's).
        moment_dtype: ``torch.float32`` (default), ``torch.bfloat16``, ``torch.uint8``: 8-bit
            blockwise moments as bitsandbytes' ``AdamW8bit`` keeps them (codes of its dynamic
            maps, a float32 absmax per 256 elements, states ``exp_avg_absmax`` ...), or
            ``torch.float8_e4m3fn``: float8 moments with a scale per 256 elements, as
            torchao's ``AdamWFp8`` keeps them (the same absmax states); shard files hold their
            codes and absmax, ``state_dict()`` float32 values (no absmax); both reshard (the
            state dict through DCP), load into any moment dtype, and load back bit for bit.
        min_8bit_size: with block moments (``moment_dtype`` ``torch.uint8`` or
            ``torch.float8_e4m3fn``), a param of fewer elements keeps float32 moments, as in
            bitsandbytes' ``AdamW8bit`` (``min_8bit_size``, default 4096) and torchao's
            8-bit optimizers (4096): their state is small, and a block each costs its
            absmax. The whole tensor's element count decides (a DTensor's global one), so
            every rank agrees. 0: every param takes ``moment_dtype``.
        num_threads: CPU params and ``offload="cpu"``: worker threads (0: one per hardware
            thread).
        offload: None (state in the params' device memory) or ``"host"``: every param's
            state (fp32 master, moments, block scales) in pinned host memory, which each step
            streams through a fixed device ring (3 x 32 MiB) over the host link: no device
            memory of its own, the same bits as without offload, a step at the link's speed
            (``bench/offload_step``). ``state_dict()`` then holds CPU tensors. Or ``"cpu"``
            (ZeRO-Offload's scheme): the state in pinned host memory, stepped there by the
            host's threads (``num_threads``) on each param and grad brought down, the param sent
            back up: the same bits again, no state byte over the link, but the step runs at the
            host's memory bandwidth; not inside a CUDA graph (an fp8 param's master is
            updated on the host and cast on the device). CPU params' state is host memory
            either way.
        step_in_backward: step each param as soon as its grad is ready, during the backward
            (torch's post-accumulate-grad hook; FSDP2 calls it once a grad is reduce-scattered),
            in partial steps of about 64 MiB of grads and the rest at the backward's end, then
            free the grad (``p.grad`` becomes None): grads wait for their update only that long.
            ``step()`` then does nothing more (it runs a closure). The updates are bit for bit a
            full step's. Not with ``max_grad_norm`` (clipping needs every grad first) nor with a
            loss scale (GradScaler): each raises, the latter at ``step()``.
        fp8: ``{param: Fp8(scaling, scale, amax=None)}`` for every param of
            ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` data (see :class:`Fp8`): the
            optimizer keeps a float32 master, and each step updates it and writes the
            float8 param and its scales. Their grads are float32 (``param.grad_dtype`` is
            set to it; bfloat16/float16 where ``grad_dtype`` already says so). The master
            starts as the param's value times its scale's inverse, again at the first step
            (the weights may have been loaded since); a loaded state dict or shard file
            casts the param from the loaded master.
        max_grad_norm: clip to this global norm (None: no clipping; ``math.inf``: compute
            ``self.grad_norm`` without clipping). May be changed between steps.
        norm_type: 2.0 or ``math.inf``.
        process_group: the torch.distributed group spanning every rank that holds params
            (default: the world).
        comm: a :class:`shardadam.Comm` to use instead of creating one.
        foreach, fused, capturable, differentiable: torch's implementation choices, taken
            where they mean what FusedAdam does (``foreach`` None/False/True, ``fused``
            None/True, ``capturable`` and ``differentiable`` False) and kept in the groups
            as AdamW keeps them; any other value raises ValueError saying why
            (docs/python.md). Also in param-group dicts.

    - **state**: a param is a key of ``self.state`` once it has state as torch means it
      (a step gave it a grad, a load a state, or it was read by key); ``state[p]["step"]``
      is its live count (an assignment sets it). ``copy.deepcopy`` gives a working copy;
      pickling raises (save ``state_dict()``). Sparse grads are refused.

    - **save_shard_file() / load_shard_files()**: shardadam's own checkpoint of the optimizer
      state (one safetensors shard file per rank, any N ranks loaded onto any M); the model
      weights are not in it (save those with ``torch.distributed.checkpoint``).

    ``self.native`` is the underlying :class:`shardadam.Optimizer`.
    """

    _step_supports_amp_scaling = True

    def __init__(self, params, lr=_DEFAULTS["lr"], betas=_DEFAULTS["betas"], eps=_DEFAULTS["eps"],
                 weight_decay=_DEFAULTS["weight_decay"], *,
                 decoupled_weight_decay=_DEFAULTS["decoupled_weight_decay"], amsgrad=_DEFAULTS["amsgrad"],
                 maximize=_DEFAULTS["maximize"], bias_correction=_DEFAULTS["bias_correction"], master=None,
                 grad_dtype=None, moment_dtype=None, min_8bit_size=4096, num_threads=0, max_grad_norm=None,
                 norm_type=2.0, process_group=None, comm=None, fp8=None, offload=None, step_in_backward=False,
                 **hyperparameters):
        unknown = set(hyperparameters) - set(_schema.KEYS) - set(IMPLEMENTATION_DEFAULTS)
        if unknown:
            raise TypeError(f"FusedAdam got unexpected keyword arguments {sorted(unknown)}")
        _check_implementation(hyperparameters, "FusedAdam")
        # The library's other hyperparameters (none today) and torch's implementation keys
        # are keywords too, with their defaults; the groups hold what AdamW's groups hold.
        defaults = {**_DEFAULTS, **IMPLEMENTATION_DEFAULTS, **hyperparameters}
        defaults.update(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        decoupled_weight_decay=decoupled_weight_decay, amsgrad=amsgrad, maximize=maximize,
                        bias_correction=bias_correction)
        for key in _OWN_KEYS:
            if defaults[key] == _DEFAULTS[key]:
                del defaults[key]  # set_group_hyperparameters: kept out of the groups at its default
        self._init(params, defaults, master=master, grad_dtype=grad_dtype, moment_dtype=moment_dtype,
                   min_8bit_size=min_8bit_size, num_threads=num_threads, max_grad_norm=max_grad_norm,
                   norm_type=norm_type, process_group=process_group, comm=comm, fp8=fp8, offload=offload,
                   step_in_backward=step_in_backward)

    # ---- the groups as this optimizer's face shows them --------------------------------------
    # FusedAdam's groups hold the library's keys (AdamW's, and its own once set); a subclass
    # with torch groups of other keys (shardadam.torch.Muon) overrides these four.
    _GROUP_KEYS = _schema.KEYS  # the keys whose values a group's library hyperparameters come from
    _STATE_HAS_STEP = True  # a loaded param state must hold "step" (torch's Adam keeps one)

    def _library_hyperparameters(self, group):
        """A torch param group's hyperparameters in the library's keys and types."""
        return _hyperparameters(group)

    def _show_hyperparameters(self, group, hyperparameters):
        """Writes the library's hyperparameters (Python keys) into a torch param group."""
        set_group_hyperparameters(group, hyperparameters)

    def _fixed_keys(self):
        """The group keys that cannot change once a group holds params."""
        return _schema.fixed_keys()

    def _init(self, params, defaults, *, master, grad_dtype, moment_dtype, min_8bit_size, num_threads,
              max_grad_norm, norm_type, process_group, comm, fp8, offload, step_in_backward):
        """Everything of __init__ after the groups' defaults: the options, then torch's
        Optimizer.__init__ (which adds every group)."""
        # What copy.deepcopy needs to build another FusedAdam like this one.
        if offload not in _OFFLOADS:
            raise ValueError(f"FusedAdam: offload must be one of {', '.join(repr(k) for k in _OFFLOADS)}, "
                             f"got {offload!r}")
        if step_in_backward not in (False, True):
            raise ValueError(f"FusedAdam: step_in_backward must be a bool, got {step_in_backward!r}")
        if step_in_backward and max_grad_norm is not None:
            raise ValueError("FusedAdam: step_in_backward steps each param as its grad arrives, but max_grad_norm "
                             "clips by the norm of every grad, known only after the whole backward; use one or "
                             "the other")
        self._options = dict(master=master, grad_dtype=grad_dtype, moment_dtype=moment_dtype,
                             min_8bit_size=min_8bit_size, num_threads=num_threads, norm_type=norm_type,
                             process_group=process_group, comm=comm, offload=offload,
                             step_in_backward=step_in_backward)
        # Set before super().__init__, which calls add_param_group for every group.
        self._param_options = {key: self._options[key] for key in ("master", "grad_dtype", "moment_dtype")}
        self._param_options["placement"] = _OFFLOADS[offload]
        if isinstance(min_8bit_size, bool) or not isinstance(min_8bit_size, int) or min_8bit_size < 0:
            raise ValueError(f"FusedAdam: min_8bit_size must be an int >= 0, got {min_8bit_size!r}")
        # The element count below which a param keeps float32 moments (block moments only).
        block = moment_dtype is not None and dtype_name(to_dtype(moment_dtype)) in BLOCK_MOMENT_DTYPES
        self._min_block_numel = min_8bit_size if block else 0
        self._fp8 = dict(fp8) if fp8 else {}
        # step_in_backward: the params whose grads arrived in this backward, not stepped yet
        # (native indices), and the params given a hook (a re-registration must not add one).
        self._step_in_backward = step_in_backward
        self._plain_options_cache = {}  # _plain_options'
        self._arrived = []
        self._arrived_bytes = 0
        self._hooked = set()
        self._num_threads = num_threads
        self.native = None
        self._entries = []
        self._entry_of = {}
        self._params = []
        self._placements = []      # per param: its DTensor placements tuple (None: a plain tensor)
        self._seen_placements = []  # per param: grad placements last found equal to those (a cache)
        self._held_grads = None    # the tensors bound for the step under way (bind_param_grads)
        self._names = []           # native param index -> name (for the errors of the grad intake)
        self._pushed = []          # per group: the hyperparameters the native group holds
        self._pushed_raw = []      # per group: its raw values then, where comparing them is enough
        self._scalars = None       # device buffer: [1 / grad_scale, found_inf]
        self._stepped = False
        self.max_grad_norm = max_grad_norm
        self.norm_type = norm_type
        self._clip_args(max_grad_norm)  # checks both now rather than at the first step
        self._process_group = process_group
        self._comm = comm          # made at the first step that needs one (collective), unless given
        self.grad_norm = None      # 0-dim tensor: the global grad norm of the last clipping step
        super().__init__(params, defaults)

    # ---- registration ------------------------------------------------------------------
    def _add_native_group(self, group):
        """Appends the native group of a torch param group (creating the native optimizer
        with the first one) and records the hyperparameters pushed to it."""
        hyperparameters = self._library_hyperparameters(group)
        if self.native is None:
            self.native = Optimizer(**hyperparameters, num_threads=self._num_threads)
        else:
            self.native.add_group(**hyperparameters)
        self._pushed.append(None)
        self._pushed_raw.append(None)
        self._record_pushed(len(self._pushed) - 1, group, hyperparameters)

    def add_param_group(self, param_group):
        """Adds a param group (as ``torch.optim.Optimizer.add_param_group``) and registers
        its params with the library."""
        if isinstance(param_group, dict):
            _check_implementation(param_group, "FusedAdam.add_param_group")
        with _cyclic_gc_paused():
            super().add_param_group(param_group)
            group = self.param_groups[-1]
            self._add_native_group(group)
            group_index = len(self.param_groups) - 1
            if not isinstance(self.state, _torch_state_dict.LazyStates):  # torch's __init__ made a defaultdict
                self.state = _torch_state_dict.LazyStates(self, self.state)
            self._register_group(group, group_index)

    def _register_group(self, group, group_index):
        """Registers the params of a torch param group with the library (native group
        ``group_index``), named by its ``param_names`` or by position; runs of plain params
        together."""
        params = group["params"]
        base = len(self._entries)  # every param before this one took an entry
        names = group.get("param_names") or [f"params.{base + i}" for i in range(len(params))]
        # Plain: not a DTensor, not fp8 (one comprehension: a call per param costs ~0.4 us at 100k)
        fp8 = self._fp8
        plain_flags = [(DTensor is None or not isinstance(p, DTensor)) and p.dtype not in _FP8_DTYPES
                       and not (fp8 and p in fp8) for p in params]
        plain = []  # a run of plain params, registered together
        for param, name, is_plain in zip(params, names, plain_flags):
            if is_plain and isinstance(name, str):
                plain.append((param, name))
                continue
            self._register_plain(plain, group_index)
            plain = []
            self._register(param, name, group_index)
        self._register_plain(plain, group_index)

    def _register_plain(self, params, group_index):
        """Registers plain params (``(param, name)`` pairs) of one group: their options checked
        once; with the library's default options in one native loop (Optimizer._add_tensors),
        else one native call each (Optimizer.add_param's per-call checks cost more than the
        registration at 100k params); the bookkeeping of _add_entry."""
        if not params:
            return
        min_block = self._min_block_numel
        options, small_options = self._plain_options(False), self._plain_options(True)
        defaults = options is None and (min_block == 0 or small_options is None or
                                        all(param.numel() >= min_block for param, _ in params))
        added = []
        try:
            if defaults and self.native._add_tensors(
                    group_index, [param for param, _ in params], [name for _, name in params], added):
                return
            # no autograd record: no no_grad() (~5 us a param)
            items = ((name, to_dlpack(param.detach()), small_options if param.numel() < min_block else options)
                     for param, name in params)
            self.native._add_capsules(group_index, items, added)
        except InvalidArgument as err:
            param, name = params[len(added)]
            if param.is_contiguous():
                raise
            raise InvalidArgument(_non_contiguous_advice(name, param), err.status) from err
        finally:  # the params the library took, also when a later one failed
            self._add_entries([(param, index, name, param) for (param, name), index in zip(params, added)],
                              group_index, None, None)

    def _register(self, param, name, group_index):
        if DTensor is not None and isinstance(param, DTensor):
            mesh = param.device_mesh
            coordinate = mesh.get_coordinate()
            if coordinate is None:
                raise ValueError(f"FusedAdam: this rank is not in the device mesh of param {name!r}")
            placements = tuple(param.placements)
            layout = Mesh(tuple(mesh.shape), tuple(coordinate), [_placement(p, name) for p in placements],
                          global_shape=tuple(param.shape))
        else:
            mesh, placements, layout = None, None, None
        local = _local_tensor(param).detach()  # no autograd record either way: no no_grad() (~5 us a param)
        options = self._param_options
        if param.numel() < self._min_block_numel:  # min_8bit_size
            options = dict(options, moment_dtype=torch.float32)
        if local.dtype in _FP8_DTYPES or (self._fp8 and param in self._fp8):
            options = self._fp8_options(param, name, local, options)
            if options["scaling"] in _CURRENT_SCALINGS and _splits_across_ranks(param):
                # Its amax is reduced across the ranks at every step: the library takes the
                # param only with a communicator (a collective: every rank registers it).
                self._attach_comm(local.device)
        if _splits_across_ranks(param) and self.native.param_groups[group_index].update_rule == "muon":
            # A Muon matrix split across ranks: its ranks gather their boxes' directions at every
            # step, through the communicator (made here: a collective, as above).
            self._attach_comm(local.device)
        try:
            # to_dlpack: one C call, where Tensor.__dlpack__ (Python) costs ~10x more per param;
            # the param is written on the current stream, which the library is given.
            index = self.native.add_param(name, to_dlpack(local), group=group_index, layout=layout,
                                          stream=_current_stream(local.device) if local.is_cuda else None,
                                          **options)
        except InvalidArgument as err:
            if local.is_contiguous():
                raise
            raise InvalidArgument(_non_contiguous_advice(name, local), err.status) from err
        self._add_entries([(param, index, name, local)], group_index, mesh, placements)

    def _plain_options(self, small):
        """The native options of a plain (not fp8) param, checked once and kept: ``small``, a
        param below min_8bit_size, keeps float32 moments."""
        cache = self._plain_options_cache
        if small not in cache:  # (None, the defaults, is a value too)
            kwargs = dict(self._param_options, moment_dtype=torch.float32) if small else self._param_options
            cache[small] = self.native._options_of(**kwargs)
        return cache[small]

    def _add_entries(self, rows, group_index, mesh, placements):
        """The bookkeeping of params the library took: rows of (param, native index, name,
        local tensor), all of group ``group_index`` and of the same mesh and placements."""
        native = self.native
        new = [_Entry(param, index, name, group_index, local, mesh, placements, native)
               for param, index, name, local in rows]
        if self._step_in_backward:
            for entry in new:
                if id(entry.param) not in self._hooked:
                    entry.param.register_post_accumulate_grad_hook(self._grad_arrived)
                    self._hooked.add(id(entry.param))
        pairs = [(entry.param, entry) for entry in new]
        self._entries.extend(new)
        self._entry_of.update(pairs)
        self.state.register(pairs)
        self._params.extend(entry.param for entry in new)
        spec = rows[0][0]._spec.placements if mesh is not None and rows else None
        self._placements.extend([spec] * len(new))
        self._seen_placements.extend([None] * len(new))
        self._names.extend(entry.name for entry in new)

    def _fp8_options(self, param, name, local, options):
        """add_param's options of an fp8 param: ``options`` with its Fp8's scaling and tensors,
        and float32 grads (``param.grad_dtype`` is set to float32 unless it names a grad dtype the
        library takes: torch would otherwise refuse a float32 ``.grad`` on a float8 param)."""
        spec = self._fp8.get(param) if self._fp8 else None
        if local.dtype not in _FP8_DTYPES:
            raise ValueError(f"FusedAdam: param {name!r} is {local.dtype}, but fp8= gives it {spec!r}; "
                             "fp8 params are " + " or ".join(sorted(map(str, _FP8_DTYPES))))
        if not isinstance(spec, Fp8):
            raise ValueError(f"FusedAdam: param {name!r} is {local.dtype}: give its scaling and scale tensor as "
                             f"FusedAdam(..., fp8={{param: shardadam.torch.Fp8(scaling, scale)}}), got {spec!r}")
        grad_dtype = getattr(param, "grad_dtype", None)
        if grad_dtype not in (torch.float32, torch.bfloat16, torch.float16):
            grad_dtype = torch.float32
            if hasattr(param, "grad_dtype"):
                param.grad_dtype = grad_dtype
        amax = None if spec.amax is None else _local_tensor(spec.amax).detach()
        return dict(options, grad_dtype=grad_dtype, scaling=spec.scaling,
                    scale=_local_tensor(spec.scale).detach(), amax=amax, margin=spec.margin)

    # ---- step ----------------------------------------------------------------------------
    # Opaque to torch.compile: Dynamo does not trace the native call (nor the DLPack
    # handshakes), it breaks the graph around the step and runs it eagerly (_hooked_step).
    @_hooked_step
    def step(self, closure=None, *, grad_scale=None, found_inf=None):
        """One optimizer step over every param (see the class docstring).

        Args:
            closure: re-evaluates the model and returns the loss (optional).
            grad_scale: the loss scale the grads carry (a tensor; GradScaler sets
                ``self.grad_scale`` instead). The grads are divided by it.
            found_inf: skip the step where it is nonzero (a tensor; GradScaler sets
                ``self.found_inf``).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if grad_scale is None:
            grad_scale = getattr(self, "grad_scale", None)
        if found_inf is None:
            found_inf = getattr(self, "found_inf", None)
        if self._step_in_backward:
            if grad_scale is not None or found_inf is not None:
                raise RuntimeError(
                    "FusedAdam(step_in_backward=True) stepped each param as its grad arrived, before a loss "
                    "scale or found_inf could be applied: the update used scaled grads. Train without GradScaler "
                    "(bf16 autocast needs none), or without step_in_backward")
            self._step_arrived()  # grads that arrived outside a backward (none, in a training loop)
            return loss
        if not self._entries:
            return loss
        if not self._stepped:
            if all(p.grad is None for p in self._params):
                return loss  # no grads at all: nothing to do, as torch's optimizers
            self._prepare_first_step()
        elif not self._bind_grads():
            return loss
        try:
            self._step_bound(grad_scale, found_inf)
        finally:
            self._unbind_grads()  # also when the step failed: no binding outlives the grads
        return loss

    # ---- step in backward -----------------------------------------------------------------
    # Grads arrive one param at a time (torch's post-accumulate-grad hook; FSDP2 calls it
    # on the sharded param once its grad is reduce-scattered). They are stepped in partial
    # steps (sa_optimizer_step_params) of at least _ARRIVED_BYTES of grads, and the rest at
    # the end of the backward; each stepped grad is then freed (p.grad = None), so no more
    # than about that many bytes of grads wait for their update.
    _ARRIVED_BYTES = 64 << 20

    def _grad_arrived(self, param):
        entry = self._entry_of.get(param)
        if entry is None or param.grad is None:
            return
        if not self._arrived:  # the first of this backward: step the rest at its end
            torch.autograd.Variable._execution_engine.queue_callback(self._step_arrived)
        self._arrived.append(entry)
        grad = _local_tensor(param.grad)
        self._arrived_bytes += grad.numel() * grad.element_size()
        if self._arrived_bytes >= self._ARRIVED_BYTES:
            self._step_arrived()

    def _step_arrived(self):
        """A partial step of the params whose grads arrived, then their grads freed."""
        arrived, self._arrived, self._arrived_bytes = self._arrived, [], 0
        if not arrived:
            return
        if not self._stepped:
            self._prepare_first_step()  # binds every grad there is; the partial step binds its own:
            self._unbind_grads()        # none of those bindings, nor their tensors, outlives this
        native = self.native
        stream = _current_stream(arrived[0].param.device)
        try:
            for entry in arrived:
                param = entry.param
                if entry.mesh is not None and tuple(param.grad.placements) != tuple(param.placements):
                    # A grad placed otherwise than its param (a Partial grad of tensor
                    # parallelism): redistributed first, as step() does with its grads.
                    param.grad = param.grad.redistribute(param.device_mesh, param.placements)
                native.set_grad(entry.index, _local_tensor(param.grad).detach(), stream=stream)
            self._push_hyperparameters()
            native.step_params([entry.index for entry in arrived], stream=stream)
        finally:
            for entry in arrived:  # no binding, and no reference, outlives the grads
                native.clear_grad(entry.index)
        for entry in arrived:
            entry.param.grad = None

    def _step_bound(self, grad_scale, found_inf):
        """The native step, once the grads are bound."""
        self._push_hyperparameters()
        device = self._entries[0].param.device
        stream = _current_stream(device)
        inv_address = found_address = None
        if grad_scale is not None or found_inf is not None:
            scalars = self._scalar_buffer(device)
            if grad_scale is not None:
                if isinstance(grad_scale, torch.Tensor):
                    # 1 / scale in float64 then float32, as GradScaler's own unscale, on the device.
                    scalars[0:1].copy_(grad_scale.detach().reshape(1).to(torch.float64).reciprocal())
                else:
                    scalars[0:1].fill_(1.0 / float(grad_scale))
                inv_address = scalars.data_ptr()
            if found_inf is not None:
                if isinstance(found_inf, torch.Tensor):
                    scalars[1:2].copy_(found_inf.detach().reshape(1), non_blocking=True)
                else:
                    scalars[1:2].fill_(float(found_inf))
                found_address = scalars.data_ptr() + scalars.element_size()
        clip = None
        if self.max_grad_norm is not None:
            self.grad_norm = torch.empty((), dtype=torch.float32, device=device)
            clip = self._clip_args(self.max_grad_norm) + (self.grad_norm.data_ptr(), False)
        if clip is not None or found_address is not None:
            self._attach_comm(device)
        self.native._step_addresses(inv_address, found_address, stream, clip=clip)

    def _clip_args(self, max_grad_norm):
        return None if max_grad_norm is None else _clip_args(max_grad_norm, self.norm_type)

    def _attach_comm(self, device):
        """Gives the native optimizer the communicator, creating it at the first need."""
        if self._comm is None:
            group = _distributed_group(self._process_group)
            if group is None:
                return  # one rank: its norm and found_inf are the global ones
            self._comm = _make_comm(group, device)
        if self.native.comm is not self._comm:  # also after a re-registration made a new native
            self.native.set_comm(self._comm)

    def _scalar_buffer(self, device):
        if self._scalars is None:
            self._scalars = torch.zeros(2, dtype=torch.float32, device=device)
        return self._scalars

    def _bind_grads(self, bind=True):
        """Binds every param's current grad (None: "no grad", the step skips the param) in
        one checked native call; a grad the kernel could not read as it is (dtype, device,
        shape, strides) raises, naming the param, and nothing is bound. A DTensor grad placed
        otherwise than its param (a Partial grad of tensor parallelism, another Shard dim) is
        first redistributed to the param's placements, on every rank, as torch's optimizers'
        DTensor arithmetic does; the redistributed grad replaces ``p.grad``. Returns the
        number of params with a grad (0: nothing was bound). ``bind=False`` reads and
        describes the grads, reads their extents and strides, and binds nothing:
        bench/python_host_step.py measures the least a checked intake costs by it."""
        handle = self.native._handle_or_raise()
        for attempt in range(2):
            # `.grad` of a tensor-subclass param (a DTensor) goes through __torch_function__
            # dispatch, ~0.3 us per param, to reach the same getter; DTensor's __torch_function__
            # is torch's disabled one, so turning subclass dispatch off reads the same grads.
            try:
                # The collector paused too: reading the grads makes short-lived objects whose
                # collections traversed the young tensors (measured: ~1/3 of the intake at 100k
                # params on a 2-core VM).
                with _no_subclass_torch_function(), _cyclic_gc_paused():
                    status, count, misplaced, held = _grad_intake.bind_param_grads(
                        handle, self._params, self._names, DTensor, to_dlpack, self._placements,
                        self._seen_placements, _TorchShard, _TorchReplicate, bind)
            except TypeError:
                self._refuse_sparse_grads()  # DLPack's own error for them never says "sparse"
                raise
            if not misplaced:
                break
            if attempt:
                raise RuntimeError(f"FusedAdam: the grads of params {[self._names[i] for i in misplaced]} are still "
                                   "placed otherwise than their params after redistribution")
            for i in misplaced:
                param = self._params[i]
                param.grad = param.grad.redistribute(param.device_mesh, param.placements)
        check(status, handle)
        self._held_grads = held  # what was bound, alive until _unbind_grads
        return count

    def _refuse_sparse_grads(self):
        """Raises a TypeError naming the first param whose grad is sparse (a failed bind
        only: the steady step does not look)."""
        for param, name in zip(self._params, self._names):
            grad = param.grad
            if grad is not None and _local_tensor(grad).layout != torch.strided:
                raise TypeError(
                    f"FusedAdam: param {name!r} has a sparse grad ({_local_tensor(grad).layout}); FusedAdam, like "
                    "torch's AdamW, steps dense grads only. Make the layer's grads dense (e.g. "
                    "nn.Embedding(..., sparse=False)), or give the param to torch.optim.SparseAdam") from None

    def _unbind_grads(self):
        """After the step: the library keeps no pointer into grads that zero_grad() may free
        (a step of ``self.native`` before the next bind skips every param), and the tensors
        the bind held are let go."""
        if self.native is not None and not self.native.closed:
            handle = self.native._handle
            check(_grad_intake.unbind_grads(handle), handle)
        self._held_grads = None

    def _prepare_first_step(self):
        """Re-registers params whose memory moved since they were added, binds the grads,
        and refreshes fp32 master weights from the params (they may have been loaded
        since)."""
        moved = [e.name for e in self._entries if e.numel > 0 and _local_tensor(e.param).data_ptr() != e.local_ptr]
        if moved:
            self._reregister()
        self._bind_grads()
        if self._step_in_backward:  # partial steps leave the group counts: each param's says
            steps = _torch_state_dict.param_steps(self)
            fresh = [entry for entry in self._entries if steps[entry.index] == 0]
        else:
            fresh = self._entries if all(group.step == 0 for group in self.native.param_groups) else []
        for entry in fresh:
            if entry.fp8:  # its master from its value (which may have been loaded since)
                self.native.reset_masters(entry.index, 1)
                continue
            if not entry.sixteen_bit:
                continue  # a float32 param has neither master nor remainder (the library refuses both)
            state = self.state.views(entry.param)
            local_param = _local_tensor(entry.param)
            if "master" in state:
                _local_tensor(state["master"]).copy_(local_param)
            if "remainder" in state:
                _local_tensor(state["remainder"]).zero_()
        self._stepped = True

    def _reregister(self):
        """A fresh native optimizer over the params' current memory, keeping the state."""
        old_native, old_states = self.native, {e.param: self.state.views(e.param) for e in self._entries}
        shown = list(dict.keys(self.state))  # the params that are keys of self.state
        steps = [group.step for group in old_native.param_groups]
        param_steps = _torch_state_dict.param_steps(self)
        self.native, self._entries, self._entry_of, self._params = None, [], {}, []
        self._pushed, self._pushed_raw = [], []
        self._placements, self._seen_placements = [], []
        self.state.clear()  # old_states holds the old entries; the new ones are made on first read
        self._names = []
        with _cyclic_gc_paused():
            for group_index, group in enumerate(self.param_groups):
                self._add_native_group(group)
                self._register_group(group, group_index)
        for param, old in old_states.items():
            new = self.state.views(param)
            for key, value in old.tensors():
                _local_tensor(new[key]).copy_(_local_tensor(value))
        for group, step in zip(self.native.param_groups, steps):
            group.step = step
        _torch_state_dict.set_param_steps(self, param_steps)  # after the groups': setting those sets these
        self.state.show_only(shown)
        old_native.close()

    def _push_hyperparameters(self):
        """Gives the native groups the param groups' hyperparameters where they changed (an
        LR scheduler's lr, most often). A group whose raw values are the ones last pushed,
        all plain numbers, is skipped without converting them."""
        for index, group in enumerate(self.param_groups):
            raw = tuple(map(group.get, self._GROUP_KEYS))
            if raw == self._pushed_raw[index]:  # None (not comparable this way) never equals
                continue
            hyperparameters = self._library_hyperparameters(group)
            pushed = self._pushed[index]
            if hyperparameters != pushed:
                native_group = self.native.param_groups[index]
                if all(hyperparameters[k] == pushed[k] for k in hyperparameters if k != "lr"):
                    native_group.lr = hyperparameters["lr"]
                else:
                    native_group.update(**hyperparameters)
            self._record_pushed(index, group, hyperparameters, raw)

    def _record_pushed(self, index, group, hyperparameters, raw=None):
        """Notes that native group `index` holds `hyperparameters`, read from torch's `group`.
        Its raw values are kept for the next step's comparison only when they are immutable
        numbers (floats, ints, bools, tuples of them, None): a tensor lr changes in place, and
        so could a list of betas, without the group's values changing identity."""
        if raw is None:
            raw = tuple(map(group.get, self._GROUP_KEYS))
        plain = all(type(v) in _PLAIN_NUMBERS or (type(v) is tuple and all(type(x) in _PLAIN_NUMBERS for x in v))
                    for v in raw)
        self._pushed[index] = hyperparameters
        self._pushed_raw[index] = raw if plain else None

    # ---- copies ----------------------------------------------------------------------------
    def __getstate__(self):
        raise TypeError(
            "FusedAdam cannot be pickled or shallow-copied (pickle, torch.save(optimizer), copy.copy): its state lives "
            "in the native library. Save optimizer.state_dict() instead (torch.save(optimizer.state_dict(), path)) "
            "and load it into a new FusedAdam with load_state_dict(); copy.deepcopy(optimizer) makes a working copy.")

    def __deepcopy__(self, memo):
        """A FusedAdam of its own, as ``copy.deepcopy`` of a torch optimizer gives: the
        params deep-copied through ``memo`` (so ``copy.deepcopy((model, optimizer))`` gives
        an optimizer over the copied model's params), the same options and hyperparameters,
        every state copied bit for bit (8-bit codes and absmax, masters), the same step
        counts, and its hooks. It shares the process group and a communicator given as
        ``comm=``; one made at a step is made again by the copy when it needs one (a
        collective call, as for the original)."""
        groups = []
        for group in self.param_groups:
            copied = {key: copy.deepcopy(value, memo) for key, value in group.items() if key != "params"}
            copied["params"] = [copy.deepcopy(param, memo) for param in group["params"]]
            groups.append(copied)
        fp8 = {copy.deepcopy(param, memo): copy.deepcopy(spec, memo) for param, spec in self._fp8.items()}
        other = type(self)(groups, **self.defaults, **self._options, max_grad_norm=self.max_grad_norm, fp8=fp8)
        memo[id(self)] = other
        for mine, theirs in zip(self._entries, other._entries):
            for key in self.native.state_keys(mine.index):
                target = torch.from_dlpack(other.native.state(theirs.index, key))
                target.copy_(torch.from_dlpack(self.native.state(mine.index, key)))
        for group, step in zip(other.native.param_groups, [g.step for g in self.native.param_groups]):
            group.step = step
        other.native.set_param_steps(self.native.param_steps())  # after the groups': those set these
        position = {param: index for index, param in enumerate(self._params)}
        other.state.show_only([other._params[position[p]] for p in dict.keys(self.state) if p in position])
        for name in ("grad_scale", "found_inf", "grad_norm"):
            if getattr(self, name, None) is not None:
                setattr(other, name, copy.deepcopy(getattr(self, name), memo))
        for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                     "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                     "_optimizer_load_state_dict_post_hooks"):
            hooks = getattr(self, name, None)
            if hooks is not None:
                getattr(other, name).update(hooks)
        if getattr(self, "_master_check", None) is not None:  # a load's pending master check
            other._optimizer_step_pre_hooks.pop(self._master_check.id, None)
            _torch_state_dict.check_masters_at_next_step(other)
        return other

    # ---- shard files -----------------------------------------------------------------------
    def save_shard_file(self, path, *, wait=True):
        """Writes this rank's optimizer state (every param's states, the groups'
        hyperparameters and step counts, the layouts) to ``path`` as a shard file; call it on
        every rank with a path of its own. The file appears complete or not at all.

        The groups' current hyperparameters are pushed to the library first, so the file
        holds what ``param_groups`` says now (e.g. the lr an LR scheduler set after the last
        step), as ``state_dict()`` would.

        ``wait=False`` returns a :class:`shardadam.SaveJob` once the state is snapshotted
        (on CUDA: copied to pinned host memory at the link's speed); training may step at
        once while a library thread writes the file. Call its ``wait()`` before relying on
        the file (e.g. before deleting an older checkpoint)."""
        self._push_hyperparameters()
        return self.native.save(path, wait=wait)

    def load_shard_files(self, paths, *, allow_missing=False, allow_unexpected=False, staging_bytes=0,
                         read_once=False):
        """Loads the shard files of every rank of a checkpoint (written by
        :meth:`save_shard_file` on any number of ranks, with any layout) and copies this
        rank's boxes into the existing state buffers. Params are matched by name (the
        ``param_names`` of the groups when the optimizer was built from ``named_parameters()``,
        else ``params.<position>``). The groups' hyperparameters and step counts are
        restored, in ``param_groups`` too (as ``load_state_dict()`` takes over the saved
        groups). Everything is validated before anything is copied; on error nothing
        changed. The options are :meth:`shardadam.Optimizer.load`'s."""
        self.native.load(paths, allow_missing=allow_missing, allow_unexpected=allow_unexpected,
                         restore_groups=True, staging_bytes=staging_bytes, read_once=read_once)
        _torch_state_dict.after_shard_files_loaded(self)

    # ---- state dict ------------------------------------------------------------------------
    def state_dict(self):
        """``torch.optim.Optimizer.state_dict()`` whose state tensors share memory with the
        library's buffers (DTensors for DTensor params), with each param's own ``step`` (read
        from the library; on CUDA this may synchronize). The groups are the live groups,
        whose keys at FusedAdam's defaults are AdamW's (``bias_correction`` appears once
        set), so torch's AdamW, DCP's default planner, torch's flattened state dicts and
        torchtitan's flat ones take FusedAdam's checkpoints and FusedAdam takes theirs."""
        return _torch_state_dict.state_dict(self)

    def load_state_dict(self, state_dict):
        """Loads a state dict (this optimizer's, torch Adam/AdamW's, or one restored by
        ``torch.distributed.checkpoint``) by copying into the existing state buffers.

        Params are matched by position, as ``torch.optim.Optimizer.load_state_dict`` does.
        Everything is checked before anything is copied (the groups' sizes and hyperparameters,
        amsgrad unchanged where a group holds params; every state's key, dtype and shape, and
        every step); on error nothing changed. A state may be a DTensor of any layout of the
        param's global shape (gathered, then this rank's box taken), or a plain tensor of the
        local or the global shape. ``step`` is each param's own count. A param whose state the
        dict lacks is reset, as torch resets it: zero moments, step 0, the master its value.
        A missing ``master`` (torch's checkpoints have none) is the param's value, a missing
        ``remainder`` zero. The groups take the saved hyperparameters; keys the dict lacks
        (``bias_correction`` in a torch checkpoint) keep their value, and torch's
        implementation keys (``foreach``, ...) are ignored.

        fp32 masters follow the params whichever is loaded first: the next step first copies
        each param into its master where the param is not the master's rounding (the model
        weights were loaded after this, or the master was not in the checkpoint). See
        :class:`shardadam.torch.FusedAdamLoadPlanner` for DCP checkpoints without masters.
        """
        _torch_state_dict.load_state_dict(self, state_dict)
