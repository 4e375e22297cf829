"""PyTorch integration: :class:`FusedAdam`, a ``torch.optim.Optimizer`` running shardadam.

This module imports without torch; torch is imported when ``FusedAdam`` is first used::

    from shardadam.torch import FusedAdam
    opt = FusedAdam(model.parameters(), lr=3e-4, weight_decay=0.1)

:class:`Fp8` gives FusedAdam a float8 param's scaling and scale tensors (``fp8=``).
:class:`Muon` is ``torch.optim.Muon`` over shardadam; a FusedAdam group with
``"update_rule": "muon"`` (and Muon's fields: ``momentum``, ``nesterov``, ``ns_a``, ...) is a
Muon group beside AdamW groups in one optimizer.
:class:`FusedAdamLoadPlanner` loads a torch.distributed.checkpoint saved with another
optimizer over 16-bit params (no fp32 masters in it) into a FusedAdam.

See ``FusedAdam``'s docstring (``help(shardadam.torch.FusedAdam)``) for the details.
"""

__all__ = ["FusedAdam", "FusedAdamLoadPlanner", "Fp8", "Muon"]  # noqa: F822 (provided by __getattr__ below, which imports torch)


def __getattr__(name):
    if name in __all__:
        try:
            from . import _torch_fused_adam, _torch_muon, _torch_state_dict
        except ImportError as err:
            if getattr(err, "name", None) == "torch" or "torch" in str(err):
                raise ImportError(f"shardadam.torch.{name} needs PyTorch (`import torch` failed)") from err
            raise
        globals().update(FusedAdam=_torch_fused_adam.FusedAdam, Fp8=_torch_fused_adam.Fp8,
                         FusedAdamLoadPlanner=_torch_state_dict.FusedAdamLoadPlanner, Muon=_torch_muon.Muon)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
