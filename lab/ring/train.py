"""A model that trains with its sequence sharded over the ring: a one-block decoder whose causal self-attention is
lab.ring.ring_attention, against the same model on one device with the whole sequence.

Each rank holds its zig-zag shard of the tokens (lab.ring.attention.shard_chunks) and their global positions
(learned position embeddings and the next-token targets come from those, so the shards see exactly what the
whole sequence would). The loss is the mean next-token cross-entropy over the whole sequence: each rank sums its
rows' terms, the sums are all-reduced, and the parameter gradients (the same parameters on every rank) are
all-reduced too. The attention's own gradients cross ranks inside ring_attention's backward.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import attention as ring


class TinyDecoder(nn.Module):
    """Embedding + positions, one causal self-attention block (GQA), an MLP, the output head."""

    def __init__(self, vocab: int = 64, dim: int = 64, heads: int = 4, kv_heads: int = 2, max_len: int = 4096):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_len, dim)
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens, positions, attend):
        """tokens (B, S_local), positions (S_local,) global; attend(q, k, v) -> (B, H, S_local, D)."""
        x = self.tok(tokens) + self.pos(positions)
        B, S, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, -1, self.head_dim).transpose(1, 2).split(
            [self.heads, self.kv_heads, self.kv_heads], dim=1)
        x = x + self.proj(attend(q.contiguous(), k.contiguous(), v.contiguous()).transpose(1, 2).reshape(B, S, -1))
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


def positions_of(seqlen: int, world: int, rank: int) -> torch.Tensor:
    """The global positions a rank's causal (zig-zag) shard holds, in shard order."""
    return torch.cat([torch.arange(b, e) for b, e in ring.shard_chunks(seqlen, world, rank, True)])


def loss_sum(logits, tokens_full, positions):
    """Sum of next-token cross-entropies of these rows (the last position of the sequence has no target)."""
    seqlen = tokens_full.shape[1]
    keep = positions < seqlen - 1
    targets = tokens_full[:, (positions + 1).clamp(max=seqlen - 1)]
    rows = logits[:, keep].flatten(0, 1)
    if rows.dtype in (torch.float16, torch.bfloat16):  # the softmax of the loss in float32, as training does
        rows = rows.float()
    return F.cross_entropy(rows, targets[:, keep].flatten(), reduction="sum")


def full_attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


def train_losses(model, batches, lr: float = 0.05, group=None, attend=None, sharded: bool | None = None) -> list[float]:
    """SGD over `batches` ((B, S) token tensors); sharded (default: when a process group is up), the ring: this
    rank's shard of each batch, gradients all-reduced; sharded=False: this process alone, the whole sequence.
    Returns the loss per step (the whole sequence's mean, on every rank)."""
    import torch.distributed as dist

    if sharded is None:
        sharded = group is not None or (dist.is_available() and dist.is_initialized())
    world, rank = (dist.get_world_size(group), dist.get_rank(group)) if sharded else (1, 0)
    losses = []
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for tokens in batches:
        seqlen = tokens.shape[1]
        positions = positions_of(seqlen, world, rank).to(tokens.device) if sharded else torch.arange(seqlen, device=tokens.device)
        if sharded:
            attend_fn = attend or (lambda q, k, v: ring.ring_attention(q, k, v, is_causal=True, group=group, seqlen=seqlen))
        else:
            attend_fn = attend or full_attend
        logits = model(tokens[:, positions], positions, attend_fn)
        count = tokens.shape[0] * (seqlen - 1)
        loss = loss_sum(logits, tokens, positions) / count
        opt.zero_grad(set_to_none=False)
        loss.backward()
        total = loss.detach().clone()
        if sharded:
            dist.all_reduce(total, group=group)
            for p in model.parameters():
                dist.all_reduce(p.grad, group=group)
        opt.step()
        losses.append(float(total))
    return losses


def make_batches(steps: int, batch: int, seqlen: int, vocab: int, seed: int = 0, device="cpu") -> list[torch.Tensor]:
    """Fixed random token batches with a learnable pattern (each token predicts the next: t + 1 mod vocab)."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, vocab, (steps, batch, 1), generator=gen)
    return [((s + torch.arange(seqlen)) % vocab).to(device) for s in starts]
