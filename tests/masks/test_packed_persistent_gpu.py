"""fwd v11's persistent packed grid (kernels/common/hopper/attn_mask_packed_sm90.cuh) on the GPU: the packed forward
grid's quick subset against float64 (uneven lengths, empty sequences, S_q != S_k, rows with no key, window, softcap,
sinks, D 64 / 128, fp16 GQA) with NaN-poisoned outputs, and the scheduler's wrong build (every unit's light tile
skipped), which must fail; then the per-tile grid (PACKED_PERSIST 0) on the same uneven causal call (the launcher's
rule sends only causal, unwindowed calls with max_seqlen_q == max_seqlen_k to the persistent grid) gives the same rows.
Skipped without CUDA or on devices other than compute capability 9.0."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs a compute capability 9.0 GPU (masked v11)")


def test_packed_forward_checks_and_wrong_build():
    from lab.masks import gpu_varlen
    assert gpu_varlen.packed_fwd_checks(quick=True) == 0


def test_persistent_grid_matches_the_per_tile_grid():
    from lab.masks import gpu_varlen_ab, op, spec
    lens_q, lens_k = [0, 5, 1025, 63, 0, 300, 128, 129], [0, 5, 1025, 63, 7, 300, 128, 129]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    torch.manual_seed(0)
    q = torch.randn(sum(lens_q), 4, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lens_k), 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    outs = []
    for defines in (None, gpu_varlen_ab.PER_TILE):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((4, q.shape[0]), float("nan"), device="cuda")
        op.launch(q, k, v, out, lse, spec.make_mask(True, None, 0.0), 128 ** -0.5, 0, None, cu_q, cu_k,
                  max(lens_q), max(lens_k), "v11", defines=defines)
        outs.append((out, lse))
    (a, la), (b, lb) = outs
    assert not a.isnan().any() and torch.equal(a, b)  # the same steps per tile, in another order of tiles
    assert torch.equal(la.nan_to_num(0.0), lb.nan_to_num(0.0)) and not la.isnan().any()
