"""torch's own context parallelism (torch.distributed.tensor.experimental.context_parallel) against the lab's
ring, forward plus backward at the same shapes, in the same processes: lab.ring.run's torch-cp stage.

torch's API is a context manager over a device mesh: it shards the given full-length buffers in place along
the sequence (for a causal mask with its head-tail load balancer: rank r keeps chunks r and 2W - 1 - r, the
lab's zig-zag) and, while it is open, routes F.scaled_dot_product_attention through DTensor to its ring over
one SDPA backend's kernels (flash, efficient or cuDNN). It rotates K/V by all-gather (its default) or
all-to-all (set_rotate_method). The lab's ring is a function over shards that the caller already holds,
like SDPA; a model calls it where it would call SDPA (lab.ring.train). torch's dispatcher knows only SDPA's
aten ops, so it cannot route to the lab's kernels, and the lab does not plug into it: the two are compared.

What cannot run is recorded with its error line, never hidden: a backend that rejects the shape or the GQA
layout, a torch whose API differs, or the CPU, where SDPA's CPU kernel is none of the ops torch's ring takes.
"""
from __future__ import annotations

import torch

ROTATIONS = ("allgather", "alltoall")
BACKENDS = {"cuda": ("cudnn", "flash"), "cpu": ("math",)}  # in order: the next only if none of one's ran


def _why(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"


def fwd_bwd_call(q, k, v, dout, backend: str):
    """Zero-argument callable: SDPA forced to `backend` and its gradients in q, k, v (this rank's shards)."""
    import torch.nn.functional as F

    from ..bench import sdpa_backend

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    gqa = q.shape[1] != k.shape[1]

    def call():
        with sdpa_backend(backend):
            out = F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=gqa)
        return (out, *torch.autograd.grad(out, leaves, dout))
    return call


def race(run, q, k, v, dout, lab_shards: tuple | None, reps: int) -> list[dict]:
    """Time torch's context parallel (every backend of BACKENDS and every rotation) on the full-length q, k,
    v, dout (the same on every rank). lab_shards: this rank's lab ring (out, dq, dk, dv), to which torch's
    own shards are compared. One dict per configuration: timing, or the error that stopped it."""
    found = []
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method
        api = (init_device_mesh(run.device.type, (run.world,)), context_parallel, set_rotate_method)
    except Exception as err:  # an API this torch lacks
        return [{"backend": b, "rotate": None, "error": _why(err)} for b in BACKENDS[run.device.type]]
    for backend in BACKENDS[run.device.type]:
        for rotate in ROTATIONS:
            row = _one(run, api, backend, rotate, (q, k, v, dout), lab_shards, reps)
            if "error" in row and q.shape[1] != k.shape[1]:  # GQA refused: what a user does next, K/V per query head
                group = q.shape[1] // k.shape[1]
                wide = (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), dout)
                again = _one(run, api, backend, rotate, wide, lab_shards, reps)
                row = {**again, "kv_expanded": True, "gqa_error": row["error"]}
            found.append(row)
        if any("timing" in r for r in found):  # flash only where cuDNN could not run
            break
    return found


def _one(run, api, backend, rotate, full, lab_shards, reps) -> dict:
    """One configuration on full-length inputs: its timing and its difference from the lab's shards, or its error."""
    mesh, context_parallel, set_rotate_method = api
    row = {"backend": backend, "rotate": rotate}
    buffers = [t.clone() for t in full]
    try:
        set_rotate_method(rotate)
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4, no_restore_buffers=set(buffers)):
            call = fwd_bwd_call(*buffers, backend)
            try:
                got = call()
                if lab_shards is not None:  # out and dq (dk, dv differ in shape when K/V were expanded)
                    row["max_abs_vs_lab"] = max(float((a.detach().float() - b.float()).abs().max())
                                                for a, b in zip(got[:2], lab_shards[:2]))
                del got
            except Exception as err:  # a backend that rejects the shape, out of memory, an API change
                row["error"] = _why(err)
            errors = [e for e in run.gather(row.get("error")) if e]  # all ranks time, or none
            if errors:
                row.setdefault("error", errors[0])
            else:
                row["timing"] = run.timed(call, reps)
    except Exception as err:  # the context itself (sharding the buffers) failed
        row["error"] = _why(err)
    del buffers
    if run.cuda:
        torch.cuda.empty_cache()
    return row
