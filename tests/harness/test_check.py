"""lab/check.py: the pass rule, the float64 reference, NaN poisoning, and a self-test of the harness.

The self-test runs small torch functions as "kernels" on CPU: correct ones must PASS check_forward /
check_decode and deliberately wrong ones (BSHD read as BHSD, missing softmax scale, missing causal
mask, an unwritten row, ignored cache lengths) must FAIL. CPU only, a few seconds.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lab import cases, check, record
from lab.cases import Case, DecodeCase
from wrong_kernels import (
    decode_correct, decode_ignores_seqlens, run_bshd_as_bhsd, run_missing_causal_mask, run_missing_scale,
    run_ignores_strides, run_reference_cast, run_sdpa_fp32, run_unwritten_last_row, run_unwritten_one_row,
)


@pytest.fixture(autouse=True)
def _isolated_records(session_dir):
    """check_forward/check_decode record by default: keep every row of this module in a tmp session."""
    return session_dir


# ------------------------------------------------------------------ compare: the pass rule and metrics

def _ref(shape=(2, 3, 5, 4), seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_compare_exact_output_passes():
    ref = _ref()
    yardstick = ref + 1e-3
    m = check.compare(ref.clone(), ref, yardstick)
    assert m["passed"] is True
    assert m["max_abs"] == 0.0 and m["rel_l2"] == 0.0 and m["mean_abs"] == 0.0
    assert m["nan"] == 0 and m["inf"] == 0 and m["mismatches"] == 0 and m["first_mismatches"] == []
    assert m["sdpa_max_abs"] == pytest.approx(1e-3)
    assert m["tol_max_abs"] == pytest.approx(check.MULTIPLIER * 1e-3 + check.ABS_FLOOR)


def test_compare_of_tensors_attached_to_a_graph_warns_nothing_and_records_no_graph():
    """A gradient check hands compare tensors that require grad (SDPA's gradient as the yardstick): the metrics
    are numbers, never a "tensor with requires_grad=True to a scalar" warning on the chapter's page."""
    import warnings

    ref = _ref()
    out = (ref.clone() + 1e-4).requires_grad_()
    yardstick = (ref + 1e-3).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = check.compare(out * 1.0, ref, yardstick * 1.0)
    assert m["passed"] is True and m["max_abs"] == pytest.approx(1e-4) and m["sdpa_max_abs"] == pytest.approx(1e-3)


def test_compare_exact_output_passes_against_an_exact_yardstick():
    ref = _ref()
    m = check.compare(ref.clone(), ref, ref.clone())  # SDPA exact: the floors keep the rule sane
    assert m["passed"] is True and m["tol_max_abs"] == check.ABS_FLOOR


def test_compare_max_abs_rule_4x_sdpa_fails_and_below_3x_passes():
    ref = _ref()
    yardstick = ref + 1e-3  # SDPA off by 1e-3 everywhere: a large relative L2 budget
    out = ref.clone()
    out[1, 2, 3, 0] += 4e-3  # one element 4x SDPA's max error
    m = check.compare(out, ref, yardstick)
    assert m["max_abs"] == pytest.approx(4e-3)
    assert m["rel_l2"] < m["sdpa_rel_l2"]  # only the max_abs rule can fail here
    assert m["passed"] is False
    assert m["mismatches"] == 1 and m["first_mismatches"] == [(1, 2, 3, 0)]
    out[1, 2, 3, 0] = ref[1, 2, 3, 0] + 2.9e-3
    m = check.compare(out, ref, yardstick)
    assert m["passed"] is True and m["mismatches"] == 0


def test_compare_rel_l2_rule_fails_with_many_small_errors():
    ref = _ref()
    yardstick = ref.clone()
    yardstick[0, 0, 0, 0] += 1e-3  # SDPA: one element off
    out = ref + 1e-3  # every element off by SDPA's max: within tol_max_abs, but 11x SDPA's rel L2
    m = check.compare(out, ref, yardstick)
    assert m["max_abs"] <= m["tol_max_abs"] and m["mismatches"] == 0
    assert m["rel_l2"] > check.MULTIPLIER * m["sdpa_rel_l2"]
    assert m["passed"] is False


def test_compare_nan_fails_even_if_everything_else_is_exact():
    ref = _ref()
    out = ref.clone()
    out[0, 1, 2, 3] = float("nan")
    m = check.compare(out, ref, ref + 1.0)  # a huge tolerance cannot excuse a NaN
    assert m["passed"] is False
    assert m["nan"] == 1 and m["inf"] == 0
    assert m["max_abs"] == 0.0  # over finite elements
    assert m["mismatches"] == 1 and m["first_mismatches"] == [(0, 1, 2, 3)]


def test_compare_inf_fails():
    ref = _ref()
    out = ref.clone()
    out[1, 0, 4, 1] = float("inf")
    m = check.compare(out, ref, ref + 1.0)
    assert m["passed"] is False and m["inf"] == 1 and m["nan"] == 0
    assert m["first_mismatches"] == [(1, 0, 4, 1)]


def test_compare_all_nan_has_nan_metrics_and_fails():
    ref = _ref()
    m = check.compare(torch.full_like(ref, float("nan")), ref, ref)
    assert m["passed"] is False and m["nan"] == ref.numel() and m["mismatches"] == ref.numel()
    assert math.isnan(m["max_abs"]) and math.isnan(m["rel_l2"])


def test_compare_mismatch_count_and_first_indices_in_bhsd_order():
    ref = _ref((2, 3, 5, 4))
    out = ref.clone()
    spots = [(1, 0, 2, 3), (0, 2, 0, 0), (0, 0, 3, 1), (1, 2, 4, 3), (0, 0, 0, 2), (1, 1, 1, 1), (0, 1, 4, 0)]
    for idx in spots:
        out[idx] += 0.5
    m = check.compare(out, ref, ref.clone())
    assert m["mismatches"] == len(spots)
    assert m["first_mismatches"] == sorted(spots)[:5]  # row-major = lexicographic (b, h, s, d)
    assert check.compare(out, ref, ref.clone(), max_listed=2)["first_mismatches"] == sorted(spots)[:2]
    assert m["max_abs"] == pytest.approx(0.5)


def test_compare_accepts_low_precision_outputs():
    ref = _ref()
    out = ref.to(torch.bfloat16)
    m = check.compare(out, ref, ref.to(torch.bfloat16))
    assert m["passed"] is True and m["max_abs"] > 0  # bf16 rounding, exactly SDPA's


# ------------------------------------------------------------------ reference vs a direct formula

def direct_attention(q, k, v, is_causal=False, scale=None, seqlens=None):
    """Element-by-element definition, float64: out[b,h,i] = sum_j softmax_j(q_i . k_j * scale) v_j."""
    q, k, v = q.double(), k.double(), v.double()
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, Hq, Sq, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        n = Sk if seqlens is None else int(seqlens[b])
        for h in range(Hq):
            g = h // (Hq // Hkv)  # query head h reads KV head h // group
            for i in range(Sq):
                keys = [j for j in range(n) if not is_causal or j <= i]  # top-left: key j visible iff j <= i
                s = torch.stack([(q[b, h, i] * k[b, g, j]).sum() * scale for j in keys])
                p = torch.exp(s - s.max())
                p = p / p.sum()
                out[b, h, i] = sum(p[t] * v[b, g, j] for t, j in enumerate(keys))
    return out


def _qkv(B, Hq, Hkv, Sq, Sk, D, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, Sq, D, generator=gen).to(dtype), torch.randn(B, Hkv, Sk, D, generator=gen).to(dtype),
            torch.randn(B, Hkv, Sk, D, generator=gen).to(dtype))


@pytest.mark.parametrize("B, Hq, Hkv, Sq, Sk, causal", [
    (2, 2, 2, 5, 5, False),
    (1, 4, 2, 3, 6, False),  # GQA
    (2, 3, 3, 4, 4, True),
    (1, 2, 2, 5, 3, True),   # causal, Sq > Sk: rows 3, 4 see every key
    (1, 2, 1, 3, 5, True),   # causal, Sq < Sk, MQA: row i sees keys 0..i only (top-left, not bottom-right)
    (1, 2, 2, 1, 7, True),   # a single query row sees key 0 only
])
def test_reference_matches_direct_formula(B, Hq, Hkv, Sq, Sk, causal):
    q, k, v = _qkv(B, Hq, Hkv, Sq, Sk, 8, seed=Sq * 10 + Sk)
    got = check.reference(q, k, v, causal)
    assert got.dtype == torch.float64 and got.shape == (B, Hq, Sq, 8)
    torch.testing.assert_close(got, direct_attention(q, k, v, causal), rtol=1e-12, atol=1e-12)


def test_reference_causal_top_left_single_row_is_first_value():
    q, k, v = _qkv(1, 2, 2, 1, 7, 8)
    got = check.reference(q, k, v, is_causal=True)
    torch.testing.assert_close(got[0, :, 0], v[0, :, 0].double())


def test_reference_custom_scale():
    q, k, v = _qkv(1, 2, 2, 4, 6, 8)
    torch.testing.assert_close(check.reference(q, k, v, scale=0.7), direct_attention(q, k, v, scale=0.7),
                               rtol=1e-12, atol=1e-12)
    assert not torch.allclose(check.reference(q, k, v, scale=0.7), check.reference(q, k, v))


def test_reference_seqlens_masks_the_cache_tail():
    q, k, v = _qkv(3, 4, 2, 2, 9, 8)
    lengths = [1, 5, 9]
    got = check.reference(q, k, v, seqlens=lengths)
    torch.testing.assert_close(got, direct_attention(q, k, v, seqlens=lengths), rtol=1e-12, atol=1e-12)
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 1:] = 100.0  # garbage beyond each sequence's length must not matter
    v2[1, :, 5:] = -100.0
    torch.testing.assert_close(check.reference(q, k2, v2, seqlens=lengths), got)


def test_sdpa_yardstick_matches_reference_in_float64():
    q, k, v = _qkv(3, 4, 2, 2, 9, 8, dtype=torch.float64)
    torch.testing.assert_close(check.sdpa(q, k, v, seqlens=[1, 5, 9]), check.reference(q, k, v, seqlens=[1, 5, 9]))
    q, k, v = _qkv(1, 4, 2, 3, 6, 8, dtype=torch.float64)
    torch.testing.assert_close(check.sdpa(q, k, v, is_causal=True), check.reference(q, k, v, is_causal=True))


def test_error_map_shape_and_unwritten_rows():
    q, k, v = _qkv(2, 3, 3, 5, 5, 4)
    ref = check.reference(q, k, v)
    out = ref.clone()
    out[1, 2, 4, 0] = float("nan")
    out[0, 0, 1, 3] += 0.25
    heat = check.error_map(out, ref)
    assert isinstance(heat, np.ndarray) and heat.shape == (3, 5)
    assert np.isinf(heat[2, 4]) and np.isfinite(np.delete(heat.ravel(), 2 * 5 + 4)).all()
    assert heat[0, 1] == pytest.approx(0.25) and heat[1].max() == 0.0


def test_resolve_device():
    assert check.resolve_device("cpu") == torch.device("cpu")
    assert check.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device must be"):
        check.resolve_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no GPU"):
            check.resolve_device("cuda")


# ------------------------------------------------------------------ self-test: "kernels" as torch functions

def _case(name):
    return next(c for c in cases.tests_cases() if c.name == name)


# Suitable cases from the tests set: more than one head and query row (a layout scramble is visible),
# causal (a missing mask is visible), fp16 and bf16, GQA, Sq < Sk and Sq > Sk.
SELF_TEST_CASES = [
    "t-2x3x3-65x65-d64-fl-c",
    "t-3x6x2-65x130-d128-bf-c",
    "t-2x4x4-63x1025-d64-fl-c",
    "t-1x4x4-1025x65-d128-bf-c",
]
WRONG = [run_bshd_as_bhsd, run_missing_scale, run_missing_causal_mask, run_unwritten_last_row]


@pytest.mark.parametrize("name", SELF_TEST_CASES)
@pytest.mark.parametrize("run", [run_sdpa_fp32, run_reference_cast], ids=lambda f: f.__name__)
def test_correct_runs_pass(name, run):
    result = check.check_forward(run, _case(name), run.__name__, trials=1, device="cpu", save=False)
    assert result.passed, repr(result)
    assert len(result.trials) == 2  # one randn trial + the peaked one
    assert result.trials[1]["magnitude"] == check.PEAKED_MAGNITUDE
    assert all(t["nan"] == 0 and t["mismatches"] == 0 for t in result.trials)
    assert repr(result).startswith("PASS ")


@pytest.mark.parametrize("name", SELF_TEST_CASES)
@pytest.mark.parametrize("run", WRONG, ids=lambda f: f.__name__)
def test_wrong_kernels_fail(name, run):
    result = check.check_forward(run, _case(name), run.__name__, trials=1, device="cpu", save=False)
    assert not result.passed, f"the harness let a wrong kernel through: {result!r}"
    assert result.worst["mismatches"] > 0
    assert repr(result).startswith("FAIL ")
    assert result.heatmap.shape == (result.case.Hq, result.case.Sq)


def test_unwritten_row_fails_with_nan_and_shows_inf_in_the_heatmap():
    case = Case("poison", 2, 3, 3, 6, 7, 16, "float16", False)
    result = check.check_forward(run_unwritten_one_row, case, "unwritten", trials=2, device="cpu", save=False)
    assert not result.passed
    assert all(t["nan"] == 16 and not t["passed"] for t in result.trials)  # one row of D=16 elements, every trial
    assert result.worst["first_mismatches"] == [(0, 1, 2, d) for d in range(5)]
    heat = result.heatmap
    assert heat.shape == (3, 6)
    assert np.isinf(heat[1, 2])
    assert np.isfinite(np.delete(heat.ravel(), 1 * 6 + 2)).all()
    assert result.summary()["nan"] == 16 and result.summary()["passed"] is False


def test_missing_causal_mask_only_fails_causal_cases():
    noncausal = Case("nc", 1, 2, 2, 9, 9, 16, "bfloat16", False)
    assert check.check_forward(run_missing_causal_mask, noncausal, "nomask", trials=1, device="cpu", save=False).passed
    causal = Case("c", 1, 2, 2, 9, 9, 16, "bfloat16", True)
    assert not check.check_forward(run_missing_causal_mask, causal, "nomask", trials=1, device="cpu", save=False).passed


def test_check_forward_draws_are_seeded_and_recorded():
    case = Case("seeded", 1, 2, 2, 4, 4, 16, "float16", False)
    seen = []

    def run(q, k, v, is_causal, scale, out):
        seen.append(q.clone())
        run_sdpa_fp32(q, k, v, is_causal, scale, out)

    first = check.check_forward(run, case, "x", trials=2, seed=7, device="cpu", save=False)
    check.check_forward(run, case, "x", trials=2, seed=7, device="cpu", save=False)
    assert [t["seed"] for t in first.trials] == [7000, 7001, 7002]
    assert [t["magnitude"] for t in first.trials] == [1.0, 1.0, check.PEAKED_MAGNITUDE]
    assert all(torch.equal(a, b) for a, b in zip(seen[:3], seen[3:]))
    assert not torch.equal(seen[0], seen[1])
    assert seen[0].dtype == torch.float16 and seen[0].shape == (1, 2, 4, 16)


def test_check_forward_passes_scale_through():
    case = Case("scaled", 1, 2, 2, 5, 6, 16, "float16", False)
    scales = []

    def run(q, k, v, is_causal, scale, out):
        scales.append(scale)
        run_sdpa_fp32(q, k, v, is_causal, scale, out)

    assert check.check_forward(run, case, "x", trials=1, device="cpu", scale=0.3, save=False).passed
    assert scales == [0.3, 0.3]
    # the kernel ignoring a custom scale is caught
    assert not check.check_forward(lambda q, k, v, c, s, out: run_sdpa_fp32(q, k, v, c, None, out), case, "x",
                                   trials=1, device="cpu", scale=0.3, save=False).passed


def test_check_forward_save_appends_a_check_record(session_dir):
    case = Case("recorded", 1, 2, 2, 4, 4, 16, "bfloat16", True)
    check.check_forward(run_sdpa_fp32, case, "good", trials=1, device="cpu")  # save=True is the default
    check.check_forward(run_unwritten_last_row, case, "bad", trials=1, device="cpu", save=True)
    rows = record.load(session_dir.parent, kind="check")
    assert [r["impl"] for r in rows] == ["good", "bad"]
    good, bad = rows
    assert good["case"] == case.as_dict()
    assert good["check"]["passed"] is True and good["check"]["trials"] == 2 and good["check"]["seeds"] == [0, 1]
    assert bad["check"]["passed"] is False and bad["check"]["nan"] == 2 * 16
    assert bad["check"]["first_mismatches"][0] == [0, 0, 3, 0]
    assert good["env"]["gpu"] and good["session"] == session_dir.name
    assert (session_dir / "records.jsonl").read_text().count("\n") == 2


def test_check_forward_save_false_records_nothing(session_dir):
    check.check_forward(run_sdpa_fp32, Case("quiet", 1, 1, 1, 2, 2, 16), "q", trials=1, device="cpu", save=False)
    assert not (session_dir / "records.jsonl").exists()


def test_check_forward_bshd_layout_hands_the_kernel_strided_views(session_dir):
    case = Case("bshd", 2, 4, 2, 9, 11, 16, "float16", True)
    seen = []

    def run(q, k, v, is_causal, scale, out):
        seen.append((q.shape, q.stride(), k.stride(), out.is_contiguous()))
        run_sdpa_fp32(q, k, v, is_causal, scale, out)

    assert check.check_forward(run, case, "good", trials=1, device="cpu", layout="bshd").passed
    shape, q_stride, k_stride, out_contiguous = seen[0]
    assert shape == (2, 4, 9, 16)
    assert q_stride == (9 * 4 * 16, 16, 4 * 16, 1) and k_stride == (11 * 2 * 16, 16, 2 * 16, 1)
    assert out_contiguous
    assert record.load(session_dir, impl="good")[0]["layout"] == "bshd"
    with pytest.raises(ValueError, match="layout must be"):
        check.check_forward(run, case, "good", trials=1, device="cpu", save=False, layout="sbhd")


def test_a_kernel_ignoring_strides_fails_only_the_bshd_layout():
    case = Case("strides", 2, 4, 4, 9, 9, 16, "bfloat16", False)
    assert check.check_forward(run_ignores_strides, case, "x", trials=1, device="cpu", save=False).passed
    assert not check.check_forward(run_ignores_strides, case, "x", trials=1, device="cpu", save=False,
                                   layout="bshd").passed


@pytest.mark.parametrize("name", ["t-2x3x3-65x65-d64-fl-c", "t-3x6x2-65x130-d128-bf-c"])
def test_lab_selftest_kernels(name):
    """lab/selftest.py (what the harness chapter shows): its control passes and each wrong kernel fails."""
    from lab import selftest

    case = _case(name)
    assert check.check_forward(selftest.correct, case, "correct", trials=1, device="cpu", save=False).passed
    for label, run in selftest.WRONG.items():
        assert not check.check_forward(run, case, label, trials=1, device="cpu", save=False).passed, label


# ------------------------------------------------------------------ decode

DECODE_CASE = DecodeCase("dt-small", 3, 4, 2, 2, 40, 64, "bfloat16", (1, 17, 40))


def test_check_decode_correct_runner_passes(session_dir):
    seen = {}

    def run(q, k, v, seqlens, scale, out):
        seen.update(seqlens=seqlens.clone(), q=q.shape, k=k.shape)
        decode_correct(q, k, v, seqlens, scale, out)

    result = check.check_decode(run, DECODE_CASE, "dec-good", trials=2, device="cpu")
    assert result.passed, repr(result)
    assert seen["seqlens"].dtype == torch.int32 and seen["seqlens"].tolist() == [1, 17, 40]
    assert seen["q"] == (3, 4, 2, 64) and seen["k"] == (3, 2, 40, 64)
    assert result.heatmap.shape == (4, 2)
    rows = record.load(session_dir, kind="check", impl="dec-good")
    assert len(rows) == 1 and rows[0]["case"]["seqlens"] == [1, 17, 40] and rows[0]["check"]["passed"]


def test_check_decode_ignoring_seqlens_fails():
    result = check.check_decode(decode_ignores_seqlens, DECODE_CASE, "dec-bad", trials=2, device="cpu", save=False)
    assert not result.passed
    # batch 2 uses its whole cache (40 of 40), so its rows are right; batches 0 and 1 are wrong
    assert {idx[0] for idx in result.worst["first_mismatches"]} <= {0, 1}


def test_check_decode_full_length_cache_equals_ignoring_seqlens():
    full = DecodeCase("dt-full", 2, 4, 4, 1, 16, 64, "float16")
    assert full.lengths() == [16, 16]
    assert check.check_decode(decode_ignores_seqlens, full, "x", trials=1, device="cpu", save=False).passed


def test_check_decode_unwritten_output_fails():
    def run(q, k, v, seqlens, scale, out):
        decode_correct(q, k, v, seqlens, scale, out)
        out[2, 3, 1] = float("nan")

    result = check.check_decode(run, DECODE_CASE, "dec-hole", trials=1, device="cpu", save=False)
    assert not result.passed and result.worst["nan"] == 64
    assert np.isinf(result.heatmap[3, 1])


# ------------------------------------------------------------------ report

def test_run_set_draws_the_failures_heatmaps(close_figures):
    import matplotlib.pyplot as plt

    cases = [Case("ok", 1, 2, 2, 4, 4, 16), Case("also", 1, 2, 2, 5, 5, 16)]
    check.run_set(run_sdpa_fp32, cases, "good", trials=1, device="cpu", save=False, progress=False)
    assert plt.get_fignums() == []  # nothing failed, nothing drawn
    check.run_set(run_missing_scale, cases, "noscale", trials=1, device="cpu", save=False, progress=False,
                  show_failures=1)
    assert len(plt.get_fignums()) == 1  # only the first failure's heatmap
