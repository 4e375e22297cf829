"""An independent float64 Adam/AdamW, written from the formula on sa_group_config in
include/shardadam/shardadam.h (PyTorch semantics). The tests compare the library to it."""
import numpy as np

try:
    import ml_dtypes
except ImportError:  # only the bfloat16 tests need it
    ml_dtypes = None


def round_to_bfloat16(x):
    """x rounded to the nearest bfloat16 (ties to even), as float64."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


class AdamReference:
    """One param's Adam state in float64.

    ``moment_rounding`` (a function) is applied to exp_avg and exp_avg_sq after each
    update, to follow moments stored in a low-precision dtype."""

    def __init__(self, param, *, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 decoupled_weight_decay=True, bias_correction=True, maximize=False, amsgrad=False,
                 moment_rounding=None):
        self.p = np.asarray(param, np.float64).copy()
        self.m = np.zeros_like(self.p)
        self.v = np.zeros_like(self.p)
        self.vmax = np.zeros_like(self.p)
        self.t = 0
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.weight_decay, self.decoupled = weight_decay, decoupled_weight_decay
        self.bias_correction, self.maximize, self.amsgrad = bias_correction, maximize, amsgrad
        self.moment_rounding = moment_rounding

    def step(self, grad, inv_grad_scale=1.0):
        """One step with ``grad`` (any dtype; read as float64)."""
        self.t += 1
        g = np.asarray(grad, np.float64) * inv_grad_scale
        if self.maximize:
            g = -g
        if self.weight_decay and not self.decoupled:
            g = g + self.weight_decay * self.p
        if self.weight_decay and self.decoupled:
            self.p = self.p * (1.0 - self.lr * self.weight_decay)
        self.m = self.beta1 * self.m + (1.0 - self.beta1) * g
        self.v = self.beta2 * self.v + (1.0 - self.beta2) * g * g
        if self.moment_rounding is not None:
            self.m = self.moment_rounding(self.m)
            self.v = self.moment_rounding(self.v)
        v = self.v
        if self.amsgrad:
            self.vmax = np.maximum(self.vmax, self.v)
            v = self.vmax
        bc1 = 1.0 - self.beta1 ** self.t if self.bias_correction else 1.0
        bc2 = 1.0 - self.beta2 ** self.t if self.bias_correction else 1.0
        self.p = self.p - (self.lr / bc1) * self.m / (np.sqrt(v) / np.sqrt(bc2) + self.eps)
