"""The mask, written out once for every layer of the lab: the Python checks of the public op, the float64
reference, the CPU emulation and (mirrored line by line) kernels/common/mask.cuh.

One sequence of S_q queries and S_k keys; `offset` places the diagonal: query i is aligned with key i + offset.
Dense calls use SDPA's top-left alignment (offset 0) unless causal_variant="lower_right" (offset S_k - S_q);
packed (varlen) sequences use FlashAttention's bottom-right alignment, each sequence its own offset S_k - S_q.
Query i sees key j (0 <= j < S_k) iff
    left  < 0 or j >= i + offset - left        (the window's left edge; -1: unbounded)
    right < 0 or j <= i + offset + right       (the right edge; causal makes right = 0)
so window_size=(W, 0) is causal with a window of W keys before the diagonal (W + 1 keys in all), as in
FlashAttention. A row that sees no key gives O = 0 and LSE = -inf (FlashAttention's rule), or LSE = sink with a
sink. Softcap s -> softcap * tanh(s / softcap) acts on the scaled score s = scale * q.k, before the mask. A sink
is a logit per query head, in the units of the scaled scores: it joins the softmax's denominator and attends to
nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Mask:
    left: int = -1     # keys before the diagonal a row sees (-1: all)
    right: int = -1    # keys after it (-1: all); causal sets 0
    softcap: float = 0.0

    @property
    def windowed(self) -> bool:
        return self.left >= 0 or self.right >= 0


def check_bools(**flags) -> None:
    """TypeError naming each flag that is not a bool: SDPA's own rule (a truthy string such as "no" is no flag).
    torch.compile with dynamic shapes hands a comparison of sizes (enable_gqa=q.shape[1] != k.shape[1]) over as a
    torch.SymBool, which is a bool there (named, not imported: this module has no torch)."""
    for name, value in flags.items():
        if not isinstance(value, bool) and type(value).__name__ != "SymBool":
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def make_mask(is_causal: bool, window_size, softcap) -> Mask:
    """Check window_size and softcap (TypeError/ValueError naming the argument) and fold causal in."""
    check_bools(is_causal=is_causal)
    if window_size is None:
        window_size = (-1, -1)
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or \
            not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size):
        raise TypeError(f"window_size must be a pair of ints (left, right), -1 for unbounded, got {window_size!r}")
    left, right = (int(w) for w in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1 (-1: unbounded), got {tuple(window_size)}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap):
        raise TypeError(f"softcap must be a finite float (0 = off), got {softcap!r}")
    if softcap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap!r}")
    if is_causal:
        right = 0
    return Mask(left, right, float(softcap))


def check_sinks(sinks, heads_q: int, device) -> None:
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor of shape (H_q,), got {type(sinks).__name__}")
    if sinks.dtype != torch.float32:
        raise TypeError(f"sinks.dtype must be torch.float32, got {sinks.dtype}")
    if tuple(sinks.shape) != (heads_q,):
        raise ValueError(f"sinks must have shape (H_q,) = ({heads_q},), got {tuple(sinks.shape)}")
    if sinks.device != device:
        raise ValueError(f"sinks is on {sinks.device} but query is on {device}")


def visible(rows, cols, seqlen_k: int, offset: int, mask: Mask):
    """Boolean [len(rows), len(cols)] tensor: query row i sees key j (the rule in the module docstring)."""
    i, j = rows[:, None], cols[None, :]
    ok = (j >= 0) & (j < seqlen_k)
    if mask.left >= 0:
        ok = ok & (j >= i + offset - mask.left)
    if mask.right >= 0:
        ok = ok & (j <= i + offset + mask.right)
    return ok


def key_range(m0: int, m1: int, seqlen_k: int, offset: int, mask: Mask) -> tuple[int, int]:
    """[lo, hi): the keys some row of [m0, m1) sees (hi <= lo: none). kernels/common/mask.cuh's key_range."""
    lo = max(0, m0 + offset - mask.left) if mask.left >= 0 else 0
    hi = min(seqlen_k, m1 - 1 + offset + mask.right + 1) if mask.right >= 0 else seqlen_k
    return lo, hi


def tile_range(m0: int, m1: int, seqlen_k: int, offset: int, mask: Mask, block_n: int) -> tuple[int, int]:
    """[first, last) key tiles of block_n keys that a block of rows [m0, m1) reads; the others are skipped."""
    lo, hi = key_range(m0, m1, seqlen_k, offset, mask)
    if hi <= lo:
        return 0, 0
    return lo // block_n, -(-hi // block_n)


def tile_is_full(m0: int, m1: int, n0: int, n1: int, seqlen_k: int, offset: int, mask: Mask) -> bool:
    """Every row of [m0, m1) sees every key of [n0, n1): the tile needs no per-element mask."""
    if n1 > seqlen_k:
        return False
    if mask.left >= 0 and n0 < m1 - 1 + offset - mask.left:
        return False
    if mask.right >= 0 and n1 - 1 > m0 + offset + mask.right:
        return False
    return True


def query_rows(n0: int, n1: int, seqlen_q: int, offset: int, mask: Mask) -> tuple[int, int]:
    """[lo, hi): the query rows that see some key of [n0, n1) (hi <= lo: none): row i sees key j iff
    j >= i + offset - left and j <= i + offset + right. The backward's key-major loop visits only these
    (kernels/common/hopper/attn_bwd_mask_sm90.cuh's window_rows, which returns them inclusive)."""
    lo = max(0, n0 - offset - mask.right) if mask.right >= 0 else 0
    hi = min(seqlen_q, n1 - 1 - offset + mask.left + 1) if mask.left >= 0 else seqlen_q
    return lo, hi


def query_block_range(n0: int, n1: int, seqlen_q: int, offset: int, mask: Mask, block_m: int) -> tuple[int, int]:
    """[first, last) query blocks of block_m rows that key block [n0, n1) visits in the backward."""
    lo, hi = query_rows(n0, n1, seqlen_q, offset, mask)
    if hi <= lo:
        return 0, 0
    return lo // block_m, -(-hi // block_m)
