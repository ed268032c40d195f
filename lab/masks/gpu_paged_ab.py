"""The plain packed call (no block table) of fwd v11 before and after the paged instantiations were added: a
pre-paged source of v11 (any path; the headers are the tree's, whose non-paged code did not change) built and
timed in rounds against the tree's v11 on the same launch. A diagnostic of lab.masks.gpu_paged's race: the SASS of
every non-paged kernel is identical (tools/sass/sass_guard.sh), so the two should time alike.
"""
from __future__ import annotations

import torch

from .. import bench, build
from . import op as mop, spec
from .gpu import GEN, draw


def before_after(source: str, budget_s: float = 2.0) -> list:
    before = mop._LAUNCH(build.build_kernel(source).address("attn_fwd_v11"))
    rows = []
    for D, lens in ((128, [2048] * 4), (64, [2048] * 4), (128, [100, 3000, 700, 4000])):
        GEN.manual_seed(D)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        q, k, v = (draw(sum(lens), 16, D, dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        mask = spec.make_mask(True, None, 0.0)

        def run(name):
            mop.launch(q, k, v, out, None, mask, D ** -0.5, 0, None, cu, cu, max(lens), max(lens), name)
            return out.clone()
        now = run("v11")
        saved = mop._calls[("v11", ())]
        mop._calls[("v11", ())] = before
        old = run("v11")
        mop._calls[("v11", ())] = saved

        def swap(call):
            def go():
                keep = mop._calls[("v11", ())]
                mop._calls[("v11", ())] = call
                mop.launch(q, k, v, out, None, mask, D ** -0.5, 0, None, cu, cu, max(lens), max(lens), "v11")
                mop._calls[("v11", ())] = keep
            return go
        t = bench.time_interleaved({"before": (swap(before), None), "after": (swap(saved), None)}, budget_s=budget_s)
        ratio = t["before"].median_ms / t["after"].median_ms
        rows.append((D, lens, t["before"].median_ms, t["after"].median_ms, ratio))
        print(f"plain varlen D {D} lens {lens}: before {t['before'].median_ms:.3f} ms, after {t['after'].median_ms:.3f}"
              f" ms, before/after {ratio:.3f}, same output {bool(torch.equal(now, old))}", flush=True)
    return rows
