"""The GPU paths of FP8 training replaced by CPU math, for the tests of lab.fp8.backward and lab.fp8.checks_bwd:
op.run, the FP8 backward kernel and the bf16 backward as the caller gives them (the bf16 backward by float64
autograd), the device check by a no-op."""
from __future__ import annotations

import torch

from lab.check import reference_grads
from lab.fp8 import backward, kernel_bwd, op


def install(monkeypatch, run, kernel, on_bf16):
    """Patch op.run with `run`, the kernel with `kernel` and the bf16 backward with float64 autograd, calling
    `on_bf16(version)` each time it runs."""
    from lab.backward import op as bwd_op

    def bwd_impl(grad_out, q, k, v, out, lse, grad_lse, is_causal, scale, deterministic, version):
        on_bf16(version)
        _, dq, dk, dv = reference_grads(q, k, v, grad_out, is_causal, scale)
        return dq.to(torch.bfloat16), dk.to(torch.bfloat16), dv.to(torch.bfloat16)

    monkeypatch.setattr(op, "run", lambda *a, **kw: run(*a, **kw))
    monkeypatch.setattr(kernel_bwd, "backward", kernel)
    monkeypatch.setattr(bwd_op, "_bwd_impl", bwd_impl)
    monkeypatch.setattr(bwd_op, "backward_version", lambda head_dim, capability, deterministic: "v14")
    monkeypatch.setattr(backward, "_capability_check", lambda device: (9, 0))
