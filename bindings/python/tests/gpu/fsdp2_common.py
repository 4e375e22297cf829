"""What the FSDP2 scripts of this folder share: a small transformer, its data, the FSDP2
wrapping and a free port. Imported by fsdp2_train.py and reshard_fsdp2.py (a script's folder
is first on sys.path, also in its torch.multiprocessing children)."""
import socket
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the transformer. ``seq`` is also the number of rows of the positional
    embedding; ``empty_shard`` adds a 1-element param (``logit_scale``), whose shard is
    empty on every rank but the first."""

    vocab: int
    dim: int
    heads: int
    layers: int
    seq: int
    empty_shard: bool = False


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads, dim = config.heads, config.dim
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, t, dim))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab, config.dim)
        self.pos = nn.Parameter(torch.randn(config.seq, config.dim) * 0.02)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab, bias=False)
        self.logit_scale = nn.Parameter(torch.ones(1)) if config.empty_shard else None

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return logits * self.logit_scale if self.logit_scale is not None else logits


def batch(config, step, global_batch, rank=0, world=1):
    """The global batch of a step (the same whatever the world size), rows
    ``[rank * global_batch // world, (rank + 1) * global_batch // world)`` of it (all of it
    by default). Sequences follow next = (5 * token + a per-sequence offset) % vocab: learnable."""
    gen = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, config.vocab, (global_batch, 1), generator=gen)
    offset = torch.randint(0, 7, (global_batch, 1), generator=gen)
    tokens = [start]
    for _ in range(config.seq):
        tokens.append((tokens[-1] * 5 + offset) % config.vocab)
    tokens = torch.cat(tokens, dim=1)
    rows = slice(rank * global_batch // world, (rank + 1) * global_batch // world)
    return tokens[rows, :-1], tokens[rows, 1:]


def shard_model(model, mesh, mp_policy=None, offload_policy=None):
    """fully_shard every block, then the root (FSDP2's usual nesting); returns the model.
    ``offload_policy``: e.g. ``CPUOffloadPolicy()`` (the sharded params, their grads and the
    optimizer step on the host)."""
    options = {} if mp_policy is None else {"mp_policy": mp_policy}
    if offload_policy is not None:
        options["offload_policy"] = offload_policy
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
