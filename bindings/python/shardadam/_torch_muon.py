"""Muon: torch.optim.Muon's face over shardadam (imported lazily by shardadam.torch)."""
import torch

from . import _schema
from . import _torch_fused_adam as _fused

_LIBRARY = _schema.defaults()  # the fields Muon does not read keep the library's defaults
# torch.optim.Muon's own defaults where the library's are AdamW's (eps, weight_decay); the
# rest are the library's, which are torch's (tests/test_schema.cpp checks them).
_DEFAULTS = dict(lr=1e-3, weight_decay=0.1, momentum=_LIBRARY["momentum"], nesterov=_LIBRARY["nesterov"],
                 ns_coefficients=(_LIBRARY["ns_a"], _LIBRARY["ns_b"], _LIBRARY["ns_c"]), eps=1e-7,
                 ns_steps=_LIBRARY["ns_steps"], adjust_lr_fn=None)
_ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


class Muon(_fused.FusedAdam):
    """``torch.optim.Muon`` over shardadam: its signature, its param groups and its state
    (``momentum_buffer``), one native call per step.

    Each param is a 2-D matrix (a param of another rank is refused, naming it: put
    embeddings, norms, biases and heads in a :class:`FusedAdam`, or in a FusedAdam group of
    their own). At each step every matrix's ``momentum_buffer`` takes its grad, the update
    (Nesterov's by default) is orthogonalized by ``ns_steps`` Newton-Schulz iterations (bfloat16
    GEMMs on cuBLAS on CUDA, as torch; float32 on a CBLAS on the CPU), and the param is
    decayed and moved by the lr that ``adjust_lr_fn`` gives its shape.

    What :class:`FusedAdam` offers around the update is here too: GradScaler's
    ``grad_scale``/``found_inf``, ``max_grad_norm`` (clipping by the norm of every grad),
    ``state_dict()``/``load_state_dict()`` (torch's Muon state dicts load, and ours load into
    torch's: its state is ``momentum_buffer``; ours adds each param's ``step``, which torch's
    Muon ignores), and :meth:`save_shard_file`/:meth:`load_shard_files`.

    DTensor matrices (FSDP2's ``fully_shard``, HSDP, tensor parallelism: ``Shard(0)``,
    ``Shard(1)``, ``Replicate()`` on any mesh) are stepped whole: each matrix has one owner
    rank; at every step each rank sends its boxes of the update direction to their owners
    (one exchange for all matrices, through the communicator the first such param makes:
    NCCL for CUDA params, torch.distributed for CPU ones), each owner orthogonalizes its
    whole matrices and sends every rank its boxes of the result, so the result is the
    unsharded one, bit for bit. Params are float32, or bfloat16 with a float32 master (the
    update is applied to the master, the param is its rounding; ``state[p]["master"]``);
    grads float32 or bfloat16; ``momentum_buffer`` float32 unless ``moment_dtype`` is
    ``torch.bfloat16`` (torch's Muon keeps it in the grads' dtype, and casts a loaded one to
    its params').

    Args:
        params, lr, weight_decay, momentum, nesterov, ns_coefficients, eps, ns_steps,
        adjust_lr_fn: as in ``torch.optim.Muon`` (``adjust_lr_fn`` None or "original":
            ``lr * sqrt(max(1, rows / cols))``; "match_rms_adamw": ``lr * 0.2 * sqrt(max(rows, cols))``).
        num_threads, max_grad_norm, norm_type, process_group, comm: as in :class:`FusedAdam`.
    """

    _GROUP_KEYS = tuple(_DEFAULTS)
    _STATE_HAS_STEP = False  # torch's Muon keeps none

    def __init__(self, params, lr=_DEFAULTS["lr"], weight_decay=_DEFAULTS["weight_decay"],
                 momentum=_DEFAULTS["momentum"], nesterov=_DEFAULTS["nesterov"],
                 ns_coefficients=_DEFAULTS["ns_coefficients"], eps=_DEFAULTS["eps"], ns_steps=_DEFAULTS["ns_steps"],
                 adjust_lr_fn=_DEFAULTS["adjust_lr_fn"], *, num_threads=0, max_grad_norm=None, norm_type=2.0,
                 process_group=None, comm=None, master=None, grad_dtype=None, moment_dtype=None, min_8bit_size=4096,
                 fp8=None, offload=None, step_in_backward=False):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        self._library_hyperparameters(defaults)  # a bad value raises here, not at the first group
        self._init(params, defaults, master=master, grad_dtype=grad_dtype, moment_dtype=moment_dtype,
                   min_8bit_size=min_8bit_size, num_threads=num_threads, max_grad_norm=max_grad_norm,
                   norm_type=norm_type, process_group=process_group, comm=comm, fp8=fp8, offload=offload,
                   step_in_backward=step_in_backward)

    def _library_hyperparameters(self, group):
        """torch.optim.Muon's group keys as the library's hyperparameters (update_rule muon)."""
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            lr = lr.item()
        coefficients = tuple(group["ns_coefficients"])
        if len(coefficients) != 3:
            raise ValueError(f"Muon: ns_coefficients must be 3 numbers (a, b, c), got {group['ns_coefficients']!r}")
        adjust = group["adjust_lr_fn"]
        if adjust not in _ADJUST_LR_FNS:
            raise ValueError(f"Muon: adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {adjust!r}")
        values = dict(_LIBRARY, update_rule="muon", lr=lr, weight_decay=group["weight_decay"],
                      momentum=group["momentum"], nesterov=group["nesterov"], ns_a=coefficients[0],
                      ns_b=coefficients[1], ns_c=coefficients[2], eps=group["eps"], ns_steps=group["ns_steps"],
                      adjust_lr=adjust or "original")
        return {key: _schema.coerce(key, value) for key, value in values.items()}

    def _show_hyperparameters(self, group, hyperparameters):
        """The library's hyperparameters in torch.optim.Muon's group keys."""
        h = hyperparameters
        group.update(lr=h["lr"], weight_decay=h["weight_decay"], momentum=h["momentum"], nesterov=h["nesterov"],
                     ns_coefficients=(h["ns_a"], h["ns_b"], h["ns_c"]), eps=h["eps"], ns_steps=h["ns_steps"])
        if not (h["adjust_lr"] == "original" and group.get("adjust_lr_fn") is None):
            group["adjust_lr_fn"] = h["adjust_lr"]

    def _fixed_keys(self):
        return ()  # the rule is Muon's in every group
