"""float64 attention with the mask written out (lab.masks.spec), differentiable: the yardstick of every
masked kernel and of the emulated backward (torch.autograd through it gives dQ, dK, dV and d sinks).

Plain math, one (B, H, S_q, S_k) score tensor per call: meant for the check sizes, not for long sequences.
"""
from __future__ import annotations

import math

import torch

from .spec import Mask, visible


def attend(q, k, v, mask: Mask, scale: float | None = None, offset: int = 0, sinks=None):
    """(out, lse) in float64 for (B, H, S, D) inputs (GQA by head groups). lse is the natural log over the
    visible keys and the sink; a row that sees nothing gives out = 0 and lse = -inf (or the sink)."""
    q, k, v = q.double(), k.double(), v.double()
    B, Hq, Sq, D = q.shape
    group = Hq // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    s = scale * (q @ k.transpose(-1, -2))
    if mask.softcap > 0:
        s = mask.softcap * torch.tanh(s / mask.softcap)
    rows = torch.arange(Sq, device=q.device)
    cols = torch.arange(k.shape[2], device=q.device)
    seen = visible(rows, cols, k.shape[2], offset, mask)
    s = s.masked_fill(~seen, float("-inf"))
    if sinks is not None:
        sink = sinks.double().view(1, Hq, 1, 1).expand(B, Hq, Sq, 1)
        lse = torch.logsumexp(torch.cat([s, sink], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s - safe[..., None])  # 0 where masked; the sink's share is left out of P V
    return p @ v, lse


def attend_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, mask: Mask, scale=None, sinks=None):
    """Packed (total, H, D) sequences, each attended on its own with the bottom-right offset S_k - S_q.
    Returns (out (total_q, H_q, D_v), lse (H_q, total_q)) in float64."""
    cq, ck = [int(x) for x in cu_seqlens_q], [int(x) for x in cu_seqlens_k]
    Hq = q.shape[1]
    out = torch.zeros(q.shape[0], Hq, v.shape[-1], dtype=torch.float64, device=q.device)
    lse = torch.full((Hq, q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    outs, lses = [], []
    for b in range(len(cq) - 1):
        sq, sk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        qb = q[cq[b]:cq[b + 1]].transpose(0, 1)[None]
        kb, vb = (t[ck[b]:ck[b + 1]].transpose(0, 1)[None] for t in (k, v))
        if sq == 0:
            continue
        if sk == 0:  # nothing to see: out 0, lse the sink's (or -inf)
            ob = torch.zeros(1, Hq, sq, v.shape[-1], dtype=torch.float64, device=q.device)
            lb = (sinks.double()[None, :, None].expand(1, Hq, sq) if sinks is not None else
                  torch.full((1, Hq, sq), float("-inf"), dtype=torch.float64, device=q.device))
        else:
            ob, lb = attend(qb, kb, vb, mask, scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]),
                            sk - sq, sinks)
        outs.append((cq[b], cq[b + 1], ob[0].transpose(0, 1)))
        lses.append((cq[b], cq[b + 1], lb[0]))
    if not outs:
        return out, lse
    # Built by concatenation (not in-place writes) so autograd reaches every input.
    pieces, lpieces, at = [], [], 0
    for (a, e, ob), (_, _, lb) in zip(outs, lses):
        if a > at:
            pieces.append(out[at:a])
            lpieces.append(lse[:, at:a])
        pieces.append(ob)
        lpieces.append(lb)
        at = e
    if at < q.shape[0]:
        pieces.append(out[at:])
        lpieces.append(lse[:, at:])
    return torch.cat(pieces), torch.cat(lpieces, dim=1)
