"""The backward pass measured and checked: adapters for lab.check, timed steps and the sweep for the bench,
the FLOP count, and a small training run (lab.backward registers the autograd itself).

Kept apart from lab.backward so that lab.ops (which imports lab.backward to make attention differentiable)
never imports the harness, and the harness may import lab.ops, lab.bench and lab.sweep freely.
"""
from __future__ import annotations

import torch

from .. import bench, op_common, ops, record
from .op import _bwd_impl


def bwd_runner(version: str = "v01", deterministic: bool = False, defines=None):
    """For lab.check.check_backward: run(q, k, v, is_causal, scale, dout) -> (out, dq, dk, dv).

    The forward is lab.ops.attention's default kernel (its lse feeds the backward); the backward is `version`,
    built with `defines` (e.g. {"LAB_BWD_BUG_NO_DELTA": None}, the self-test that must fail).
    """
    def run(q, k, v, is_causal, scale, dout):
        resolved = op_common._scale(scale, q.shape[-1])
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


def ours_step(mode: str, q, k, v, is_causal: bool, dout=None, version=None):
    """For lab.bench: a zero-argument call of the public op in `mode` ('bwd' or 'fwd+bwd').

    'bwd' runs torch.autograd.grad on a graph recorded once (retain_graph), so only the backward is timed.
    """
    return _step(lambda a, b, c: ops.attention(a, b, c, is_causal=is_causal, enable_gqa=a.shape[1] != b.shape[1],
                                               version=version), mode, q, k, v, dout)


def route_step(mode: str, q, k, v, is_causal: bool, dout=None):
    """ours_step through the Python route: an explicit version= (lab.backward.op.EagerAttention) with the kernels the
    default call's C++ autograd node runs (lab.backward.node), so the two differ in host work alone."""
    from ..fwd.op import attention_version

    return ours_step(mode, q, k, v, is_causal, dout, version=attention_version(q, None, is_causal))


def sdpa_step(backend: str, mode: str, q, k, v, is_causal: bool, dout=None):
    """The same for SDPA forced to `backend` (the backward runs the backend its forward chose)."""
    import torch.nn.functional as F

    def fwd(a, b, c):
        with bench.sdpa_backend(backend):
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
    factor = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[mode]
    return factor * bench.attention_flops(B, Hq, Sq, Sk, D, causal)


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


BWD_MODES = ("bwd", "fwd+bwd")


def backward_sweep(cases, mode: str = "bwd", backends=("flash", "cudnn", "efficient"), progress: bool = True,
                   **stop) -> list[dict]:
    """Time the public op's backward (mode 'bwd': torch.autograd.grad on a recorded graph) or forward plus
    backward ('fwd+bwd') against SDPA forced to each backend, in the same process. FLOPs: backward 2.5x the
    forward's (5*B*H*S^2*D, halved for causal), fwd+bwd 3.5x. Rows are recorded with kind 'bwd' / 'fwd+bwd'."""
    from tqdm.std import tqdm

    from ..sweep import _inputs_fwd, _row

    if mode not in BWD_MODES:
        raise ValueError(f"mode must be one of {BWD_MODES}, got {mode!r}")
    ceilings_ = bench.ceilings()
    rows = []
    for i, case in enumerate(tqdm(cases, desc=f"{mode} sweep", disable=not progress, mininterval=5)):
        q, k, v = _inputs_fwd(case, seed=i)
        dout = _inputs_fwd(case, seed=10_000 + i)[0]
        work = flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal, mode)
        times = {}
        for backend in backends:
            times[backend] = _try_step(lambda: sdpa_step(backend, mode, q, k, v, case.causal, dout), **stop)
            rows.append(record.append(_row(mode, f"sdpa-{backend}", case, times[backend], work, ceilings_,
                                           {"flops": work})))
        t = _try_step(lambda: ours_step(mode, q, k, v, case.causal, dout), **stop)
        extra = {"ratios": bench.ratios(t, times) if isinstance(t, bench.Timing) else {}, "flops": work}
        extra["flags"] = bench.flagged(extra["ratios"])
        rows.append(record.append(_row(mode, "lab.ops.attention", case, t, work, ceilings_, extra)))
        del q, k, v, dout
    return rows


def make_step(make):
    """A step, or why it cannot be made: its construction runs the forward (mode 'bwd'), which a backend (or
    FlexAttention's compiler) may refuse."""
    try:
        return make()
    except (RuntimeError, ValueError, NotImplementedError) as err:
        torch.cuda.synchronize()
        return f"unsupported: {str(err).splitlines()[0][:120]}"


def _try_step(make, **stop):
    """try_time for a step that make_step builds."""
    fn = make_step(make)
    return fn if isinstance(fn, str) else bench.try_time(fn, **stop)
