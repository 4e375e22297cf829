"""PyTorch integration: :class:`FusedAdam`, a ``torch.optim.Optimizer`` running shardadam.

This module imports without torch; torch is imported when ``FusedAdam`` is first used::

    from shardadam.torch import FusedAdam
    opt = FusedAdam(model.parameters(), lr=3e-4, weight_decay=0.1)

See ``FusedAdam``'s docstring (``help(shardadam.torch.FusedAdam)``) for the details.
"""

__all__ = ["FusedAdam"]  # noqa: F822 (provided by __getattr__ below, which imports torch)


def __getattr__(name):
    if name == "FusedAdam":
        try:
            from ._torch_fused_adam import FusedAdam
        except ImportError as err:
            if getattr(err, "name", None) == "torch" or "torch" in str(err):
                raise ImportError("shardadam.torch.FusedAdam needs PyTorch (`import torch` failed)") from err
            raise
        globals()["FusedAdam"] = FusedAdam
        return FusedAdam
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
