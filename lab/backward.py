"""The backward pass of lab.ops.attention: autograd registration, the backward custom op, runners.

`lab.ops` imports this module at its end, so `lab.ops.attention` is differentiable in query, key and value
without anyone importing it. The forward custom op `lab::attention` already returns (out, lse); autograd
saves q, k, v, out and the natural-log lse (never P) and calls `lab::attention_backward`, a custom op with
a fake implementation, so torch.compile(fullgraph=True) traces forward plus backward without a graph break.

dQ mode: fp32 atomics (the default, fewest FLOPs) or a separate dQ pass when
torch.are_deterministic_algorithms_enabled() (bit-identical across runs); kernels/bwd/v01_mma.cu says why.
"""
from __future__ import annotations

import math

import torch

from . import build, ops
from .ops import Kernel

BWD = {
    "v01": Kernel("bwd/v01_mma.cu", "attn_bwd_v01", (64, 128)),
}
BEST_BWD = ("v01",)


def backward_version(head_dim: int, version=None) -> str:
    """The backward kernel for this head dim: `version` checked, or the first of BEST_BWD that takes it."""
    return ops._version(version, BWD, head_dim, BEST_BWD)


def _bwd_impl(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, deterministic, version, defines=None):
    dq, dk, dv = build.binding().attn_bwd_call(ops.launcher(BWD, version, defines), query, key, value, out, lse,
                                               grad_lse, grad_out, scale, is_causal, deterministic)
    return dq, dk, dv


@torch.library.custom_op("lab::attention_backward", mutates_args=())
def _attention_backward_op(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, grad_lse: torch.Tensor | None, is_causal: bool,
                           scale: float, deterministic: bool, version: str
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, deterministic, version)


@_attention_backward_op.register_fake
def _(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, deterministic, version):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _setup_context(ctx, inputs, output):
    query, key, value, is_causal, scale, _version = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse)
    ctx.is_causal, ctx.scale = is_causal, scale
    ctx.set_materialize_grads(False)  # an unused lse gets no zero gradient tensor


def _backward(ctx, grad_out, grad_lse):
    query, key, value, out, lse = ctx.saved_tensors
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    if grad_lse is not None:
        grad_lse = grad_lse.contiguous()
    version = backward_version(query.shape[-1])
    dq, dk, dv = _attention_backward_op(grad_out, query, key, value, out, lse, grad_lse, ctx.is_causal, ctx.scale,
                                        torch.are_deterministic_algorithms_enabled(), version)
    return dq, dk, dv, None, None, None


torch.library.register_autograd("lab::attention", _backward, setup_context=_setup_context)


# ------------------------------------------------------------------ for lab.check and lab.bench

def bwd_runner(version: str = "v01", deterministic: bool = False, defines=None):
    """For lab.check.check_backward: run(q, k, v, is_causal, scale, dout) -> (out, dq, dk, dv).

    The forward is lab.ops.attention's default kernel (its lse feeds the backward); the backward is `version`,
    built with `defines` (e.g. {"LAB_BWD_BUG_NO_DELTA": None}, the self-test that must fail).
    """
    def run(q, k, v, is_causal, scale, dout):
        resolved = ops._scale(scale, q.shape[-1])
        with torch.no_grad():
            out, lse = ops.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                                     return_lse=True)
        dq, dk, dv = _bwd_impl(dout, q, k, v, out, lse, None, is_causal, resolved, deterministic, version, defines)
        return out, dq, dk, dv
    return run


def autograd_runner():
    """For lab.check.check_backward: the public op's own autograd path (torch.autograd.grad)."""
    def run(q, k, v, is_causal, scale, dout):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = ops.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        return out.detach(), dq, dk, dv
    return run


def ours_step(mode: str, q, k, v, is_causal: bool, dout=None):
    """For lab.bench: a zero-argument call of the public op in `mode` ('bwd' or 'fwd+bwd').

    'bwd' runs torch.autograd.grad on a graph recorded once (retain_graph), so only the backward is timed.
    """
    return _step(lambda a, b, c: ops.attention(a, b, c, is_causal=is_causal, enable_gqa=a.shape[1] != b.shape[1]),
                 mode, q, k, v, dout)


def sdpa_step(backend: str, mode: str, q, k, v, is_causal: bool, dout=None):
    """The same for SDPA forced to `backend` (the backward runs the backend its forward chose)."""
    import torch.nn.functional as F

    from .bench import sdpa_backend

    def fwd(a, b, c):
        with sdpa_backend(backend):
            return F.scaled_dot_product_attention(a, b, c, is_causal=is_causal, enable_gqa=a.shape[1] != b.shape[1])
    return _step(fwd, mode, q, k, v, dout)


def _step(fwd, mode: str, q, k, v, dout):
    if mode not in ("bwd", "fwd+bwd"):
        raise ValueError(f"mode must be 'bwd' or 'fwd+bwd', got {mode!r}")
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q) if dout is None else dout
    if mode == "bwd":
        out = fwd(q, k, v)
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return lambda: torch.autograd.grad(fwd(q, k, v), (q, k, v), dout)


def flops(B: int, Hq: int, Sq: int, Sk: int, D: int, causal: bool, mode: str) -> float:
    """FLOPs credited to a mode: backward 2.5x the forward's (5*B*H*Sq*Sk*D, halved for causal), as
    FlashAttention reports; forward plus backward 3.5x."""
    from .bench import attention_flops

    factor = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[mode]
    return factor * attention_flops(B, Hq, Sq, Sk, D, causal)


def train_losses(attention, steps: int = 8, seed: int = 0, dtype=torch.bfloat16, device: str = "cuda") -> list:
    """Loss per step of a one-block transformer language model (embedding, causal self-attention through
    `attention(q, k, v)` on (B, H, S, D), projection, residual, output head) trained with SGD on fixed random
    tokens. Same seed, same data: two attention implementations give the same curve up to rounding."""
    import torch.nn.functional as F

    torch.manual_seed(seed)
    vocab, width, heads, seqlen, batch = 256, 256, 4, 128, 8
    emb = torch.nn.Embedding(vocab, width).to(device, dtype)
    qkv = torch.nn.Linear(width, 3 * width).to(device, dtype)
    proj = torch.nn.Linear(width, width).to(device, dtype)
    head = torch.nn.Linear(width, vocab).to(device, dtype)
    params = [*emb.parameters(), *qkv.parameters(), *proj.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.5)
    gen = torch.Generator(device=device).manual_seed(1)
    tokens = torch.randint(0, vocab, (batch, seqlen + 1), generator=gen, device=device)
    losses = []
    for _ in range(steps):
        x = emb(tokens[:, :-1])
        q, k, v = qkv(x).view(batch, seqlen, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
        a = attention(q, k, v).transpose(1, 2).reshape(batch, seqlen, width)
        logits = head(x + proj(a)).float()
        loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
