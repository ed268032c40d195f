"""lab.ops.attention_fp8 on the CPU: its argument checks (shape and dtype before the device), the descale forms
it takes (FA3's), the V^T key order of fwd v13 against the wgmma register layouts, and the emulation rule the
kernel is held to. The GPU checks themselves: lab.fp8.checks (GPU-only test at the end)."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

import lab.ops as ops
from lab import paths
from lab.fp8 import emulate, op, quant

E4M3 = torch.float8_e4m3fn


def fp8(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(E4M3)


Q, K = fp8(2, 4, 65, 128), fp8(2, 2, 33, 128, seed=1)


@pytest.mark.parametrize("args, kwargs, error, words", [
    ((Q.float(), K, K), {}, TypeError, "float8_e4m3fn"),
    ((Q, K.to(torch.bfloat16), K), {"enable_gqa": True}, TypeError, "key.dtype"),
    ((Q[0], K, K), {}, ValueError, "4-D"),
    ((Q, K, K[:, :, :7]), {"enable_gqa": True}, ValueError, "shapes differ"),
    ((Q, K[:1], K[:1]), {"enable_gqa": True}, ValueError, "batch"),
    ((Q[..., :96], K[..., :96], K[..., :96]), {"enable_gqa": True}, ValueError, "(64, 128, 256)"),
    ((Q, K, K), {}, ValueError, "enable_gqa=True"),
    ((Q, fp8(2, 3, 33, 128), fp8(2, 3, 33, 128)), {"enable_gqa": True}, ValueError, "multiple"),
    ((Q, K, K), {"enable_gqa": True, "is_causal": 1}, TypeError, "is_causal"),
    ((Q, K, K), {"enable_gqa": True, "k_descale": 0.5}, TypeError, "k_descale"),
    ((Q, K, K), {"enable_gqa": True, "k_descale": torch.ones(2, 2, dtype=torch.float64)}, TypeError, "float32"),
    ((Q, K, K), {"enable_gqa": True, "v_descale": torch.ones(3)}, ValueError, "(B, H_kv) = (2, 2)"),
    ((Q, K, K), {"enable_gqa": True, "k_descale": torch.ones(2, 4)}, ValueError, "k_descale"),
    ((Q, K, K), {"enable_gqa": True, "scale": float("nan")}, TypeError, "scale"),
    ((Q, K, K), {"enable_gqa": True}, ValueError, "CUDA device"),  # every other check passed: the device last
])
def test_argument_errors_come_before_the_device_check(args, kwargs, error, words):
    with pytest.raises(error) as info:
        ops.attention_fp8(*args, **kwargs)
    assert words in str(info.value)


def test_descale_forms():
    B, Hq, Hkv = 2, 4, 2
    scale, (dq, dk, dv) = op.check_args(Q, K, K, None, torch.ones(1), torch.ones(B, Hkv), False, None, True)
    assert scale == pytest.approx(128 ** -0.5)
    assert dq == (None, (0, 0), True) and dk[1:] == ((0, 0), True) and dv[1:] == ((Hkv, 1), True)
    _, (dq, _, _) = op.check_args(Q, K, K, torch.ones(B, Hq), None, None, False, None, True)
    assert dq[1:] == ((Hq, 1), False)  # per query head
    _, (dq, _, _) = op.check_args(Q, K, K, torch.ones(B, Hkv).t().contiguous().t(), None, None, False, None, True)
    assert dq[1:] == ((1, B), True)  # FA3's (B, H_kv), any strides


def test_the_vt_key_order_makes_the_accumulator_the_a_fragment():
    """fwd v13 packs P's accumulator words as d[0, 1, 4, 5], d[2, 3, 6, 7], d[8, 9, 12, 13], d[10, 11, 14, 15] of
    each 32-key step (pack_p_e4m3) and stores V^T's keys in key_of_column order: A column c must then hold the
    score of key key_of_column(c), for both of the thread's rows. The C++ key_of_column, compiled on the host."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc here")
    src = paths.CACHE / "test_key_order.cu"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text('#include <cstdio>\n#include "common/hopper/attn_fp8_sm90.cuh"\n'
                   'int main() { for (int k = 0; k < 32; ++k) printf("%d ", lab::sm90::key_of_column(k)); }\n')
    exe = src.with_suffix("")
    subprocess.run([nvcc, "-std=c++17", "-I", str(paths.KERNELS), str(src), "-o", str(exe)], check=True,
                   capture_output=True)
    key_of_column = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()]
    assert sorted(key_of_column) == list(range(32))
    words = ((0, 1, 4, 5), (2, 3, 6, 7), (8, 9, 12, 13), (10, 11, 14, 15))  # indices into d[16 kk ..]
    for t in range(4):
        for r, word in enumerate(words):
            for j, d in enumerate(word):
                acc_row, acc_col = (d % 4) // 2, 8 * (d // 4) + 2 * t + d % 2  # fp32 accumulator m64nN
                a_row, a_col = r % 2, 4 * t + j + 16 * (r // 2)  # e4m3 A fragment of k32 (m16n8k32 per warp)
                assert acc_row == a_row and key_of_column[a_col] == acc_col


@pytest.mark.parametrize("block_n", sorted({64, *op.KEY_TILE.values()}))
def test_the_emulation_at_the_kernels_tile_widths_meets_its_own_rule(block_n):
    """The default build's key tile is op.KEY_TILE[D] wide (128 at D 64 and 256, 192 at D 128), 64 in earlier
    builds; the emulation at that width is the yardstick, and the widths differ by far less than the rule's
    factor (the running max only moves the points where P is rounded)."""
    x = [torch.randn(1, 2, 300, 64, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in range(3)]
    quantized = [quant.quantize(t, "e4m3") for t in x]
    ref = emulate.reference(*[t.dequantize(torch.float64) for t in quantized], True)
    narrow, wide = (emulate.errors(emulate.forward(*quantized, True, block_n=n), ref) for n in (block_n, 256))
    assert emulate.passes(narrow, wide) and emulate.passes(wide, narrow)
    wrong = emulate.errors(emulate.forward(*quantized, True, block_n=block_n, descale=False), ref)
    assert not emulate.passes(wrong, narrow)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU of compute capability 9.0")
def test_gpu_checks_pass_and_the_wrong_build_fails():
    from lab.fp8 import checks
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("fwd v13 is sm_90a")
    rows = [checks.check(*checks._cell(name)) for name in ("d128-s65-c", "d64-s1000-c", "d256-s65-gqa2")]
    assert all(r["pass"] for r in rows), [checks._line(r) for r in rows]
    assert not checks.wrong_build()["pass"]


def test_the_fp22_accumulator_models():
    """emulate's S accumulator models: a product 2^16 beside a product 1 in one k32 step keeps the 1 in float32,
    loses it when the step is cut to 13 bits below its largest term (fp22-align), keeps it in a 13-bit running
    sum (fp22: 65537 needs 16 bits, so it rounds to 65536 too); mantissa rounding toward zero and to nearest."""
    x = torch.tensor([1.0 + 2**-13, 1.0 + 2**-14, -(1.0 + 3 * 2**-14), 448.0])
    assert emulate.round_mantissa(x, 13).tolist() == [1.0 + 2**-13, 1.0, -(1.0 + 2**-13), 448.0]
    assert emulate.round_mantissa(x, 13, nearest=True).tolist() == [1.0 + 2**-13, 1.0 + 2**-13, -(1.0 + 2**-12), 448.0]
    q = torch.zeros(1, 1, 1, 32)
    q[..., 0], q[..., 1] = 256.0, 1.0
    scores = {m: float(emulate._scores(q, q, m)) for m in emulate.S_ACCUMULATORS}
    assert scores == {"fp32": 65537.0, "fp22": 65536.0, "fp22-rn": 65536.0, "fp22-align": 65536.0}
    q[..., 0] = 16.0  # 256 + 1: within 13 bits, every model exact
    assert {float(emulate._scores(q, q, m)) for m in emulate.S_ACCUMULATORS} == {257.0}
    with pytest.raises(ValueError, match="s_accumulator"):
        emulate._scores(q, q, "fp16")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU of compute capability 9.0")
@pytest.mark.parametrize("D", [64, 128, 256])
def test_the_register_vt_pass_writes_the_shared_memory_pass_bytes(D):
    """LAB_FWD_FP8_VT = 2 (the V^T pass through registers) writes the same workspace, keys permuted and zero
    past S_k, as the shared-memory pass, on an uneven S_k and GQA."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("fwd v13 is sm_90a")
    q, k, v = (fp8(2, h, 300, D, seed=s).cuda() for h, s in ((4, 0), (2, 1), (2, 2)))
    smem = op.run(q, k, v, enable_gqa=True, symbol="attn_fp8_vt_v13", defines={"LAB_FWD_FP8_VT": 1})
    regs = op.run(q, k, v, enable_gqa=True, symbol="attn_fp8_vt_v13", defines={"LAB_FWD_FP8_VT": 2})
    assert smem.shape == regs.shape and torch.equal(smem, regs)


def test_key_tile_follows_the_kernels_defaults_and_a_candidates_defines():
    """op.key_tile (the emulation's width for a build) reads the same defaults as fwd v13's source: the
    warp-specialised B_c at D 128 / 256 (LAB_FWD_FP8_WARPSPEC 3), the one-warpgroup 128 at D 64."""
    import re
    source = (paths.KERNELS / "fwd" / "v13_fp8.cu").read_text()
    default = {int(d): int(bc) for d, bc in re.findall(r"#define LAB_FWD_FP8_WS_D(\d+)_BC (\d+)", source)}
    assert re.search(r"#define LAB_FWD_FP8_WARPSPEC 3\b", source)
    assert [op.key_tile(d) for d in (128, 256)] == [default[128], default[256]] == [op.KEY_TILE[128], op.KEY_TILE[256]]
    assert op.key_tile(64) == op.KEY_TILE[64] == 128
    assert op.key_tile(128, {"LAB_FWD_FP8_WS_D128_BC": "256"}) == 256
    assert op.key_tile(64, {"LAB_FWD_FP8_WS_D64_BC": 256}) == 128  # D 64 runs one warpgroup unless WARPSPEC 1
    assert op.key_tile(64, {"LAB_FWD_FP8_WARPSPEC": 1, "LAB_FWD_FP8_WS_D64_BC": 256}) == 256
    assert op.key_tile(128, {"LAB_FWD_FP8_WARPSPEC": 2}) == 128 and op.key_tile(256, {"LAB_FWD_FP8_WARPSPEC": 0}) == 64
    wide = {"LAB_FWD_FP8_WS_D128_BC": 256, "LAB_FWD_FP8_WS_D128_CAUSAL_BC": 192}  # causal calls take their own tile
    assert (op.key_tile(128, wide), op.key_tile(128, wide, causal=True), op.key_tile(256, wide, causal=True)) == (256, 192, 128)
    assert op.key_tile(128, {"LAB_FWD_FP8_WS_D128_BC": 256}, causal=True) == 256  # by default the same tile


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU of compute capability 9.0")
@pytest.mark.parametrize("D, causal", [(128, True), (128, False), (256, True), (64, False)])
def test_the_persistent_grid_writes_the_one_cta_per_tile_grids_bytes(D, causal):
    """LAB_FWD_FP8_PERSISTENT (CTAs looping over work tiles, the K / V ring running on across them) computes every
    tile as the one-CTA-per-tile grid (PERSISTENT 0) does, so O and LSE are bit for bit the same; 2 x 16 heads x 8
    query tiles is more tiles than an H200 has SMs (124 of the 132 CTAs take two), with uneven S and GQA."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("fwd v13 is sm_90a")
    q, k, v = (fp8(2, h, 1000, D, seed=s).cuda() for h, s in ((16, 0), (4, 1), (4, 2)))
    one_per_tile = {"LAB_FWD_FP8_PERSISTENT": 0, "LAB_FWD_FP8_WARPSPEC": 1}
    defines = {"LAB_FWD_FP8_PERSISTENT": 1, "LAB_FWD_FP8_WARPSPEC": 1}  # both named: the default is one of them
    o, lse = op.run(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True, defines=one_per_tile)
    o_p, lse_p = op.run(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True, defines=defines)
    assert torch.equal(o, o_p) and torch.equal(lse, lse_p)
