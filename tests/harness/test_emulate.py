"""lab/emulate.py: the float32 tile-by-tile emulation agrees with the float64 reference.

NumPy only. Run: python3 -m pytest tests/harness/test_emulate.py -q
"""
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lab.emulate import (  # noqa: E402
    DEBUG_KEYS, LOG2E, attention_reference, debug_intermediates, debug_layout, debug_size,
    flash_forward_emulated, lazy_rescale_emulated, pack_debug, unpack_debug,
)

# float32 rounding: measured errors are ~1e-6 for these sizes; a real bug (a
# missing scale, a missing rescale, a wrong mask) is off by order 0.1 to 1.
ATOL, RTOL = 1e-5, 1e-5


def make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, heads_q, seqlen_q, head_dim), dtype=np.float32)
    k = rng.standard_normal((batch, heads_kv, seqlen_k, head_dim), dtype=np.float32)
    v = rng.standard_normal((batch, heads_kv, seqlen_k, head_dim), dtype=np.float32)
    return q, k, v


def agrees(got, want):
    """The comparison the chapters use: (out, lse) within float32 rounding of the reference."""
    (out, lse), (out_ref, lse_ref) = got, want
    return (np.isfinite(out).all() and np.isfinite(lse).all()
            and np.allclose(out, out_ref, atol=ATOL, rtol=RTOL)
            and np.allclose(lse, lse_ref, atol=ATOL, rtol=RTOL))


SIZES = [(1, 1), (63, 63), (65, 65), (130, 130), (1, 130), (130, 1), (63, 65), (65, 130), (130, 63)]
BLOCKS = [(64, 64), (16, 32), (32, 16), (7, 5), (128, 128)]


@pytest.mark.parametrize("order", ["fa1", "fa2"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SIZES)
def test_emulation_matches_reference(seqlen_q, seqlen_k, is_causal, order):
    q, k, v = make_qkv(2, 6, 2, seqlen_q, seqlen_k, 32, seed=seqlen_q * 1000 + seqlen_k)
    want = attention_reference(q, k, v, is_causal=is_causal)
    for block_m, block_n in BLOCKS:
        got = flash_forward_emulated(q, k, v, is_causal=is_causal, block_m=block_m,
                                     block_n=block_n, order=order)
        assert got[0].dtype == np.float32 and got[1].dtype == np.float32
        assert got[0].shape == want[0].shape and got[1].shape == want[1].shape
        assert agrees(got, want), (block_m, block_n, np.abs(got[0] - want[0]).max())


@pytest.mark.parametrize("head_dim,block_m,block_n", [(192, 128, 112), (256, 128, 80), (160, 128, 112)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_wide_head_dims_on_the_wide_kernels_tiles(head_dim, block_m, block_n, is_causal):
    """D = 192 / 256 (and 160, which lab.ops pads to 192) on fwd v10's tiles: B_r = 128, B_c = 112 / 80, GQA,
    uneven lengths (a partial last tile on both sides)."""
    q, k, v = make_qkv(2, 4, 2, 129, 1025 if is_causal else 197, head_dim, seed=head_dim)
    q, k, v = (x.astype(np.float16) for x in (q, k, v))
    want = attention_reference(q, k, v, is_causal=is_causal)
    got = flash_forward_emulated(q, k, v, is_causal=is_causal, block_m=block_m, block_n=block_n, order="fa2")
    assert got[0].shape == (2, 4, 129, head_dim)
    assert agrees(got, want), np.abs(got[0] - want[0]).max()


@pytest.mark.parametrize("head_dim", [16, 64, 128])
@pytest.mark.parametrize("order", ["fa1", "fa2"])
def test_head_dims_scale_and_fp16_inputs(head_dim, order):
    q, k, v = make_qkv(1, 2, 1, 65, 97, head_dim, seed=head_dim)
    q, k, v = (x.astype(np.float16) for x in (q, k, v))  # kernels read fp16; both sides see the same values
    for is_causal in (False, True):
        want = attention_reference(q, k, v, is_causal=is_causal, scale=0.3)
        got = flash_forward_emulated(q, k, v, is_causal=is_causal, scale=0.3, order=order)
        assert agrees(got, want)


def test_reference_basics():
    q, k, v = make_qkv(1, 4, 2, 5, 9, 8)
    out, lse = attention_reference(q, k, v)
    assert out.dtype == np.float64 and out.shape == (1, 4, 5, 8) and lse.shape == (1, 4, 5)
    # GQA: query head 3 reads KV head 3 // 2 = 1, the same as an MHA call on that head.
    out1, lse1 = attention_reference(q[:, 3:4], k[:, 1:2], v[:, 1:2])
    assert np.allclose(out[:, 3:4], out1) and np.allclose(lse[:, 3:4], lse1)
    # Top-left causal with Sq > Sk: query 0 sees only key 0, so its output is V[0].
    qc, kc, vc = make_qkv(1, 1, 1, 6, 3, 8)
    outc, lsec = attention_reference(qc, kc, vc, is_causal=True)
    assert np.allclose(outc[0, 0, 0], vc[0, 0, 0])
    assert np.isclose(lsec[0, 0, 0], (qc[0, 0, 0] @ kc[0, 0, 0]) / math.sqrt(8))
    # Rows past Sk see every key: same as non-causal there.
    outn, _ = attention_reference(qc, kc, vc, is_causal=False)
    assert np.allclose(outc[0, 0, 2:], outn[0, 0, 2:])


def _fa2_without_rescale(q, k, v, block_n=64):
    """A wrong emulation on purpose: the running max moves but the old
    accumulator is never multiplied by alpha = exp2(m_old - m_new)."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale_log2 = np.float32(LOG2E / math.sqrt(q.shape[-1]))
    acc = np.zeros(q.shape, dtype=np.float32)
    m = np.full(q.shape[:-1], -np.inf, dtype=np.float32)
    l = np.zeros(q.shape[:-1], dtype=np.float32)
    for j0 in range(0, k.shape[2], block_n):
        s = (q @ k[:, :, j0:j0 + block_n].swapaxes(-1, -2)) * scale_log2
        m = np.maximum(m, s.max(-1))
        p = np.exp2(s - m[..., None])
        l, acc = l + p.sum(-1), acc + p @ v[:, :, j0:j0 + block_n]  # BUG: no alpha
    return acc / l[..., None], (m + np.log2(l)) / np.float32(LOG2E)


@pytest.mark.parametrize("order", ["fa1", "fa2"])
def test_wrong_emulation_is_detected(order):
    q, k, v = make_qkv(2, 4, 2, 65, 130, 32, seed=7)
    want = attention_reference(q, k, v)
    assert agrees(flash_forward_emulated(q, k, v, order=order), want)
    # Missing softmax scale.
    assert not agrees(flash_forward_emulated(q, k, v, scale=1.0, order=order), want)
    # Mask applied where none was asked for.
    assert not agrees(flash_forward_emulated(q, k, v, is_causal=True, order=order), want)
    # Forgotten rescale of the accumulator (only wrong once there are two key tiles).
    assert not agrees(_fa2_without_rescale(q, k, v), want)
    one_tile = [x[:, :, :64] for x in (k, v)]
    assert agrees(_fa2_without_rescale(q, *one_tile), attention_reference(q, *one_tile))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (37, 37), (20, 64), (64, 20), (64, 64)])
def test_debug_intermediates(seqlen_q, seqlen_k, is_causal):
    head_dim = 16
    q, k, v = make_qkv(2, 4, 2, seqlen_q, seqlen_k, head_dim, seed=3)
    d = debug_intermediates(q, k, v, is_causal=is_causal)
    assert set(d) == set(DEBUG_KEYS)
    assert d["S"].shape == (seqlen_q, seqlen_k) and d["P"].shape == (seqlen_q, seqlen_k)
    assert d["m"].shape == (seqlen_q,) and d["l"].shape == (seqlen_q,)
    assert d["O"].shape == (seqlen_q, head_dim)
    rows, cols = np.arange(seqlen_q)[:, None], np.arange(seqlen_k)[None, :]
    masked = (cols > rows) if is_causal else np.zeros((seqlen_q, seqlen_k), dtype=bool)
    assert np.all(np.isneginf(d["S"]) == masked) and np.all(d["P"][masked] == 0)
    assert np.allclose(d["m"], d["S"].max(axis=1))
    assert np.allclose(d["l"], np.exp(d["S"] - d["m"][:, None]).sum(axis=1))
    assert np.all(d["l"] >= 1)  # the max element contributes exp(0) = 1
    assert np.allclose(d["P"].sum(axis=1), 1.0)
    assert np.allclose(d["O"], d["P"] @ v[0, 0].astype(np.float64))
    out_ref, lse_ref = attention_reference(q, k, v, is_causal=is_causal)
    assert np.allclose(d["O"], out_ref[0, 0])
    assert np.allclose(d["m"] + np.log(d["l"]), lse_ref[0, 0])


def test_debug_layout_matches_kernel_offsets():
    sq, sk, dim = 37, 50, 64
    lay = debug_layout(sq, sk, dim)
    # The offsets written in kernels/fwd/v01_scalar.cu (lab_v01::V01DebugLayout).
    assert [lay[n][0] for n in DEBUG_KEYS] == [0, sq * sk, sq * sk + sq, sq * sk + 2 * sq, 2 * sq * sk + 2 * sq]
    assert debug_size(sq, sk, dim) == 2 * sq * sk + 2 * sq + sq * dim
    q, k, v = make_qkv(1, 1, 1, sq, sk, dim)
    d = debug_intermediates(q, k, v, is_causal=True)
    flat = pack_debug(d)
    assert flat.size == debug_size(sq, sk, dim) and flat.dtype == np.float32
    back = unpack_debug(flat, sq, sk, dim)
    for name in DEBUG_KEYS:
        assert np.array_equal(back[name], d[name].astype(np.float32))
    with pytest.raises(ValueError):
        unpack_debug(flat[:-1], sq, sk, dim)


def test_bad_arguments():
    q, k, v = make_qkv(1, 3, 2, 4, 4, 8)
    with pytest.raises(ValueError):
        attention_reference(q, k, v)  # 3 query heads over 2 KV heads
    q, k, v = make_qkv(1, 2, 2, 4, 4, 8)
    with pytest.raises(ValueError):
        flash_forward_emulated(q, k, v, order="fa3")


def test_importable_without_torch():
    code = "import sys; sys.modules['torch'] = None; import lab.emulate; print('ok')"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


@pytest.mark.parametrize("seqlen_q,seqlen_k,is_causal", [(1, 1, False), (63, 65, True), (65, 1025, False),
                                                        (300, 700, True), (1025, 400, False)])
def test_lazy_rescale_matches_reference(seqlen_q, seqlen_k, is_causal):
    """v07's conditional rescaling (kept max, P <= 2^8) gives softmax's answer, GQA included."""
    q, k, v = make_qkv(2, 4, 2, seqlen_q, seqlen_k, 64, seed=seqlen_q)
    out, lse, stats = lazy_rescale_emulated(q, k, v, is_causal=is_causal, block_n=176)
    assert agrees((out, lse), attention_reference(q, k, v, is_causal=is_causal))
    assert stats["p_max"] <= 2.0 ** 8


def test_lazy_rescale_skips_most_rescales_and_takes_the_full_step_when_it_must():
    # random scores: after the first tile the max moves by far less than 2^8, so rescales are rare
    q, k, v = make_qkv(1, 2, 2, 128, 4096, 128, seed=1)
    out, lse, stats = lazy_rescale_emulated(q, k, v, block_n=176)
    assert agrees((out, lse), attention_reference(q, k, v))
    first_tiles = 2 * (128 // 16)  # one per warp and head: m = -inf takes the full step
    assert stats["full_steps"] < stats["tiles"] // 4
    assert stats["full_steps"] >= first_tiles
    # a key far above everything before it (+2^20 in scaled units): the kept max would overflow P, so the
    # warps that see it take the full step, and the answer is still softmax's (no inf, no NaN)
    k2 = k.copy()
    k2[:, :, 3000] = q[0, 0].mean(axis=0) * 2000
    out2, lse2, stats2 = lazy_rescale_emulated(q, k2, v, block_n=176)
    assert agrees((out2, lse2), attention_reference(q, k2, v))
    assert stats2["full_steps"] > stats["full_steps"] and stats2["p_max"] <= 2.0 ** 8


def test_lazy_rescale_needs_a_positive_scale():
    q, k, v = make_qkv(1, 1, 1, 4, 4, 64)
    with pytest.raises(ValueError, match="scale > 0"):
        lazy_rescale_emulated(q, k, v, scale=-0.5)
