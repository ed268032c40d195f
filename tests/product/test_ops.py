"""lab/ops.py on CPU: argument validation (TypeError/ValueError naming the argument), version selection,
and the custom ops' fake implementations.

Tensors "on CUDA" come from FakeTensorMode: on a CPU-only torch it creates fake cuda tensors (metadata
only), so the public functions run their full validation and then the registered fake kernels. No
kernel is built or launched.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lab import op_common, ops, registry
from lab.decode import op as decode_op
from lab.kernels import resolve_version

F16, BF16 = torch.float16, torch.bfloat16


@pytest.fixture
def fake():
    with FakeTensorMode():
        yield lambda *shape, dtype=F16: torch.empty(*shape, dtype=dtype, device="cuda")


# ------------------------------------------------------------------ the ops are registered

def test_custom_ops_are_registered():
    assert hasattr(torch.ops.lab, "attention") and hasattr(torch.ops.lab, "decode")
    assert "lab::attention" in str(torch.ops.lab.attention.default._schema)
    assert "lab::decode" in str(torch.ops.lab.decode.default._schema)


def test_attention_fake_shapes(fake):
    q, k = fake(2, 8, 33, 64), fake(2, 2, 70, 64)
    out = ops.attention(q, k, k, enable_gqa=True)
    assert out.shape == (2, 8, 33, 64) and out.dtype == F16 and out.device.type == "cuda"
    out, lse = ops.attention(q, k, k, is_causal=True, enable_gqa=True, return_lse=True)
    assert out.shape == (2, 8, 33, 64) and lse.shape == (2, 8, 33) and lse.dtype == torch.float32
    direct_out, direct_lse = torch.ops.lab.attention(fake(1, 2, 5, 128, dtype=BF16), fake(1, 2, 7, 128, dtype=BF16),
                                                     fake(1, 2, 7, 128, dtype=BF16), False, 0.1, "v02")
    assert direct_out.shape == (1, 2, 5, 128) and direct_out.dtype == BF16 and direct_lse.shape == (1, 2, 5)


def test_decode_fake_shapes(fake):
    q, kc = fake(3, 32, 1, 128, dtype=BF16), fake(3, 8, 4096, 128, dtype=BF16)
    out = ops.decode(q, kc, kc, num_splits=4)
    assert out.shape == (3, 32, 1, 128) and out.dtype == BF16
    seqlens = torch.empty(3, dtype=torch.int32, device="cuda")
    assert torch.ops.lab.decode(fake(3, 32, 16, 128, dtype=BF16), kc, kc, seqlens, 0.1, 2, "v01").shape == (3, 32, 16, 128)


# ------------------------------------------------------------------ _check_tensor (every check, in its order)

def test_check_tensor_type_dtype_rank_device_on_cpu():
    with pytest.raises(TypeError, match=r"^query must be a torch.Tensor, got list"):
        op_common._check_tensor([1.0], "query")
    with pytest.raises(TypeError, match=r"^query\.dtype must be torch.float16 or torch.bfloat16, got torch.float32"):
        op_common._check_tensor(torch.empty(1, 1, 1, 64), "query")
    with pytest.raises(TypeError, match=r"^key\.dtype must be .* got torch.int64"):
        op_common._check_tensor(torch.empty(1, 1, 1, 64, dtype=torch.int64), "key")
    with pytest.raises(ValueError, match=r"^query must be 4-D \(B, H, S, D\), got shape \(2, 3, 64\)"):
        op_common._check_tensor(torch.empty(2, 3, 64, dtype=F16), "query")
    with pytest.raises(ValueError, match=r"^value must be on a CUDA device, got cpu"):
        op_common._check_tensor(torch.empty(1, 1, 1, 64, dtype=F16), "value")


def test_public_functions_reject_cpu_tensors():
    q = torch.randn(1, 2, 4, 64).to(F16)
    with pytest.raises(ValueError, match="query must be on a CUDA device.*lab.emulate"):
        ops.attention(q, q, q)
    with pytest.raises(ValueError, match="query must be on a CUDA device"):
        ops.decode(q[:, :, :1], q, q, num_splits=1)
    with pytest.raises(TypeError, match=r"query\.dtype .* got torch.float32"):
        ops.attention(q.float(), q, q)
    with pytest.raises(ValueError, match="query must be 4-D"):
        ops.attention(q[0], q, q)


def test_validation_on_fake_cuda_tensors(fake):
    q = fake(2, 4, 8, 64)
    cases = [
        (lambda: ops.attention(q, fake(2, 4, 8, 64, dtype=BF16), fake(2, 4, 8, 64)), TypeError,
         r"key\.dtype \(torch.bfloat16\) must match query\.dtype \(torch.float16\)"),
        (lambda: ops.attention(q, fake(2, 4, 8, 64), fake(2, 4, 8, 64, dtype=torch.float32)), TypeError,
         r"value\.dtype must be torch.float16 or torch.bfloat16"),
        (lambda: ops.attention(q, fake(2, 4, 8, 128), fake(2, 4, 8, 128)), ValueError,
         r"key has head dim 128 but query has 64"),
        (lambda: ops.attention(q, fake(3, 4, 8, 64), fake(3, 4, 8, 64)), ValueError, r"key has batch 3 but query has batch 2"),
        (lambda: ops.attention(q, fake(2, 4, 8, 64), fake(2, 4, 9, 64)), ValueError, r"key and value shapes differ"),
        (lambda: ops.attention(q, fake(2, 2, 8, 64), fake(2, 2, 8, 64)), ValueError,
         r"query has 4 heads but key has 2: pass enable_gqa=True"),
        (lambda: ops.attention(fake(2, 6, 8, 64), fake(2, 4, 8, 64), fake(2, 4, 8, 64), enable_gqa=True), ValueError,
         r"query heads \(6\) must be a multiple of key heads \(4\)"),
        (lambda: ops.attention(q, fake(2, 4, 0, 64), fake(2, 4, 0, 64)), ValueError, r"key has sequence length 0"),
        (lambda: ops.attention(q, q, q, is_causal=1), TypeError, r"is_causal must be a bool, got int"),
        (lambda: ops.attention(fake(2, 4, 64, 8).transpose(-1, -2), q, q), ValueError,
         r"query must have a contiguous last dimension, got stride\(-1\) = 8; call query.contiguous\(\)"),
        (lambda: ops.attention(q, q, fake(2, 4, 64, 8).transpose(-1, -2)), ValueError,
         r"value must have a contiguous last dimension"),
        (lambda: ops.attention(fake(1, 2, 4, 96), fake(1, 2, 4, 96), fake(1, 2, 4, 96), version=2), ValueError,
         r"head dim 96 is not supported by v02 \(supported: \[64, 128\]\)"),
        (lambda: ops.attention(fake(1, 2, 4, 264), fake(1, 2, 4, 264), fake(1, 2, 4, 264)), ValueError,
         r"head dims query/key 264, value 264: lab.ops.attention runs D_qk and D_v up to 256"),
        (lambda: ops.attention(fake(1, 2, 4, 64), fake(1, 2, 4, 64), fake(1, 2, 4, 320)), ValueError,
         r"head dims query/key 64, value 320"),
        (lambda: ops.attention(fake(1, 2, 4, 160), fake(1, 2, 4, 160), fake(1, 2, 4, 160)), ValueError,
         r"head dim 192: the forward kernel for D_qk, D_v above 128 \(fwd v10, wgmma\) runs on compute capability 9.0 "
         r"only"),  # fake tensors report no capability: not a Hopper
        (lambda: ops.attention(fake(1, 2, 4, 64), fake(1, 2, 4, 80), fake(1, 2, 4, 80)), ValueError,
         r"key has head dim 80 but query has 64"),
        (lambda: ops.attention(fake(1, 2, 4, 64), fake(1, 2, 4, 64), fake(1, 2, 5, 96)), ValueError,
         r"key and value must agree in \(B, H, S\)"),
        (lambda: ops.attention(q, q, q, version="vXX"), ValueError, r"version='vXX' is unknown; available: \['v01', 'v02'"),
        (lambda: ops.attention(q, q, q, version=999), ValueError, r"version=999 is unknown"),
        (lambda: ops.attention(q, q, q, scale=float("nan")), (TypeError, ValueError), r"scale must be a finite float"),
        (lambda: ops.attention(q, q, q, scale="0.1"), TypeError, r"scale must be a finite float or None"),
        (lambda: ops.attention(q, q, q, is_causal=True, causal_variant="bottom_right"), ValueError,
         r"causal_variant must be one of \('upper_left', 'lower_right'\), got 'bottom_right'"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()


def test_valid_variants_reach_the_op(fake):
    q = fake(2, 4, 8, 64)
    assert ops.attention(q, q, q, version=1).shape == q.shape
    assert ops.attention(q, q, q, version="v02", scale=0.5, is_causal=True).shape == q.shape
    mqa = fake(2, 1, 8, 64)
    assert ops.attention(q, mqa, mqa, enable_gqa=True).shape == q.shape
    small = fake(1, 2, 3, 32)
    assert ops.attention(small, small, small, version=1).shape == (1, 2, 3, 32)  # D=32: v01 has it
    # by default D=32 runs padded to 64 (tests/fwd/test_head_dims.py: a CPU build of torch cannot slice fake CUDA
    # tensors, so the padded calls are checked there on CPU tensors and in tests/product/test_ops_gpu.py on the GPU)
    # lower_right at S_q == S_k is the top-left mask: the op runs as usual (S_q != S_k: tests/fwd/test_causal.py
    # on the CPU, tests/product/test_ops_gpu.py through the kernels; a CPU build of torch cannot slice fake CUDA tensors)
    assert ops.attention(q, q, q, is_causal=True, causal_variant="lower_right").shape == q.shape


def test_decode_validation_on_fake_cuda_tensors(fake):
    q, kc = fake(2, 8, 1, 128), fake(2, 2, 64, 128)
    cases = [
        (lambda: ops.decode(fake(2, 8, 17, 128), kc, kc, num_splits=1), ValueError,
         r"query length must be 1\.\.16 tokens for decode, got 17"),
        (lambda: ops.decode(fake(2, 8, 0, 128), kc, kc, num_splits=1), ValueError, r"query length must be 1\.\.16"),
        (lambda: ops.decode(q, kc, fake(2, 2, 65, 128), num_splits=1), ValueError,
         r"key_cache and value_cache shapes differ"),
        (lambda: ops.decode(q, fake(2, 3, 64, 128), fake(2, 3, 64, 128), num_splits=1), ValueError,
         r"query heads \(8\) must be a multiple of key_cache heads \(3\)"),
        (lambda: ops.decode(q, fake(2, 2, 64, 64), fake(2, 2, 64, 64), num_splits=1), ValueError,
         r"key_cache has head dim 64 but query has 128"),
        (lambda: ops.decode(q, kc, kc, torch.empty(2, dtype=torch.float32, device="cuda"), num_splits=1), TypeError,
         r"cache_seqlens must be an int32 or int64 tensor"),
        (lambda: ops.decode(q, kc, kc, [64, 64], num_splits=1), TypeError, r"cache_seqlens must be an int32"),
        (lambda: ops.decode(q, kc, kc, torch.empty(3, dtype=torch.int32, device="cuda"), num_splits=1), ValueError,
         r"cache_seqlens must have shape \(2,\), got \(3,\)"),
        (lambda: ops.decode(q, kc, kc, torch.empty(2, 1, dtype=torch.int32, device="cuda"), num_splits=1), ValueError,
         r"cache_seqlens must have shape \(2,\), got \(2, 1\)"),
        (lambda: ops.decode(q, kc, kc, num_splits=0), ValueError, r"num_splits must be an int in \[1, 1024\] or None, got 0"),
        (lambda: ops.decode(q, kc, kc, num_splits=-2), ValueError, r"num_splits must be an int in \[1, 1024\]"),
        (lambda: ops.decode(q, kc, kc, num_splits=True), ValueError, r"num_splits must be an int in \[1, 1024\]"),
        (lambda: ops.decode(q, kc, kc, num_splits=2.0), ValueError, r"num_splits must be an int in \[1, 1024\]"),
        (lambda: ops.decode(q, kc, kc, num_splits=1, version="vXX"), ValueError, r"version='vXX' is unknown"),
        (lambda: ops.decode(fake(2, 8, 1, 72), fake(2, 2, 64, 72), fake(2, 2, 64, 72), num_splits=1), ValueError,
         r"head dim 72 is not supported by any kernel \(supported: \[64, 80, 96, 128, 192, 256\]\)"),
        (lambda: ops.decode(q, kc, kc, num_splits=1, scale=math.inf), (TypeError, ValueError), r"scale must be a finite"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()
    assert ops.decode(fake(2, 8, 16, 128), kc, kc, num_splits=3).shape == (2, 8, 16, 128)  # q_len 16 is allowed


def _cpu(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


_I32 = torch.int32
_Q, _Q1, _VQ = _cpu(2, 4, 33, 64), _cpu(2, 4, 1, 64), _cpu(10, 4, 64)
_PAGES, _TABLE, _LENS, _CU = _cpu(8, 16, 4, 64), torch.zeros(2, 4, dtype=_I32), torch.tensor([5, 9], dtype=_I32), \
    torch.tensor([0, 4, 10], dtype=_I32)
# Every argument that can be judged without a GPU is judged before the device check: a call on CPU tensors names
# its bad argument, never "query must be on a CUDA device" (each call reached the device check first before).
CPU_BAD_CALLS = {
    "scale nan": (lambda: ops.attention(_Q, _Q, _Q, scale=float("nan")), TypeError, r"scale must be a finite"),
    "scale str": (lambda: ops.attention(_Q, _Q, _Q, scale="1"), TypeError, r"scale must be a finite"),
    "head dim 300": (lambda: ops.attention(*(_cpu(2, 4, 33, 300),) * 3), ValueError, r"up to 256"),
    "padded heads": (lambda: ops.attention(_cpu(2, 4, 33, 96), *(_cpu(2, 3, 33, 96),) * 2), ValueError,
                     r"enable_gqa=True"),
    "padded is_causal": (lambda: ops.attention(*(_cpu(2, 4, 33, 96),) * 3, is_causal="x"), TypeError,
                         r"is_causal must be a bool"),
    "version": (lambda: ops.attention(_Q, _Q, _Q, version="vXX"), ValueError, r"version='vXX' is unknown"),
    "masked scale": (lambda: ops.attention(_Q, _Q, _Q, window_size=(4, 0), scale=float("inf")), TypeError,
                     r"scale must be a finite"),
    "masked head dim 300": (lambda: ops.attention(*(_cpu(2, 4, 33, 300),) * 3, softcap=5.0), ValueError,
                            r"up to 256"),
    "masked version": (lambda: ops.attention(_Q, _Q, _Q, softcap=5.0, version="vXX"), ValueError,
                       r"masked kernels"),
    "varlen scale": (lambda: ops.attention_varlen(_VQ, _VQ, _VQ, _CU, _CU, 6, 6, scale="x"), TypeError,
                     r"scale must be a finite"),
    "varlen head dim 300": (lambda: ops.attention_varlen(*(_cpu(10, 4, 300),) * 3, _CU, _CU, 6, 6),
                            NotImplementedError, r"head dim 300 has no kernel on any device"),
    "paged prefill scale": (lambda: ops.attention_varlen(_VQ, _PAGES, _PAGES, _CU, torch.tensor([0, 5, 14], dtype=_I32),
                                                         6, 9, block_table=_TABLE, scale=float("nan")), TypeError,
                            r"scale must be a finite"),
    "decode scale": (lambda: ops.decode(_Q1, _Q, _Q, scale="x"), TypeError, r"scale must be a finite"),
    "decode head dim 72": (lambda: ops.decode(_cpu(2, 4, 1, 72), *(_cpu(2, 4, 33, 72),) * 2), ValueError,
                           r"head dim 72 is not supported by any kernel"),
    "decode cache_seqlens shape": (lambda: ops.decode(_Q1, _Q, _Q, cache_seqlens=torch.tensor([3], dtype=_I32)),
                                   ValueError, r"cache_seqlens must have shape \(2,\)"),
    "decode cache_seqlens dtype": (lambda: ops.decode(_Q1, _Q, _Q, cache_seqlens=torch.tensor([1.0, 2.0])), TypeError,
                                   r"cache_seqlens must be an int32 or int64"),
    "decode num_splits": (lambda: ops.decode(_Q1, _Q, _Q, num_splits=-3), ValueError, r"num_splits must be an int"),
    "decode version": (lambda: ops.decode(_Q1, _Q, _Q, version="vXX"), ValueError, r"version='vXX' is unknown"),
    "paged decode scale": (lambda: ops.decode(_Q1, _PAGES, _PAGES, cache_seqlens=_LENS, block_table=_TABLE,
                                              scale=float("nan")), TypeError, r"scale must be a finite"),
    "paged decode head dim 72": (lambda: ops.decode(_cpu(2, 4, 1, 72), *(_cpu(8, 16, 4, 72),) * 2, cache_seqlens=_LENS,
                                                    block_table=_TABLE), ValueError, r"head dim 72 is not supported"),
    "masked decode scale": (lambda: ops.decode(_Q1, _Q, _Q, window_size=(4, 0), scale=float("nan")), TypeError,
                            r"scale must be a finite"),
    "fp8 training scale": (lambda: ops.attention_fp8_train(_Q, _Q, _Q, scale=float("nan")), TypeError,
                           r"scale must be a finite"),
    "masked decode cache_seqlens": (lambda: ops.decode(_Q1, _Q, _Q, softcap=3.0, cache_seqlens=torch.tensor([1.0, 2.0])),
                                    TypeError, r"cache_seqlens must be an int32"),
}


@pytest.mark.parametrize("name", sorted(CPU_BAD_CALLS))
def test_a_bad_argument_on_cpu_tensors_is_named_before_the_device(name):
    call, error, pattern = CPU_BAD_CALLS[name]
    with pytest.raises(error, match=pattern) as raised:
        call()
    assert "CUDA device" not in str(raised.value)


@pytest.mark.parametrize("call", [lambda: ops.attention(_Q, _Q, _Q, scale=0.125),
                                  lambda: ops.attention(*(_cpu(2, 4, 33, 96),) * 3, is_causal=True),
                                  lambda: ops.attention_varlen(_VQ, _VQ, _VQ, _CU, _CU, 6, 6, scale=0.1),
                                  lambda: ops.decode(_Q1, _Q, _Q, cache_seqlens=_LENS, num_splits=2),
                                  lambda: ops.decode(_Q1, _PAGES, _PAGES, cache_seqlens=_LENS, block_table=_TABLE)])
def test_a_good_call_on_cpu_tensors_still_meets_the_device_check(call):
    with pytest.raises(ValueError, match=r"query must be on a CUDA device, got cpu"):
        call()


# ------------------------------------------------------------------ helpers

def test_check_heads():
    q = torch.empty(1, 8, 1, 16)
    op_common._check_heads(q, torch.empty(1, 8, 1, 16), enable_gqa=False)
    op_common._check_heads(q, torch.empty(1, 2, 1, 16), enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        op_common._check_heads(q, torch.empty(1, 2, 1, 16), enable_gqa=False)
    with pytest.raises(ValueError, match=r"multiple of value heads \(3\)"):
        op_common._check_heads(q, torch.empty(1, 3, 1, 16), enable_gqa=True, what="value")
    with pytest.raises(ValueError, match=r"multiple of key heads \(0\)"):  # not a ZeroDivisionError
        op_common._check_heads(q, torch.empty(1, 0, 1, 16), enable_gqa=True)


def test_version_selection():
    assert resolve_version(None, ops.FWD, 64, ops.BEST_FWD) == ops.BEST_FWD[0]
    assert resolve_version(None, ops.FWD, 128, ops.BEST_FWD) == ops.BEST_FWD[0]
    assert resolve_version(None, ops.FWD, 32, ops.BEST_FWD) == "v01"
    assert resolve_version(1, ops.FWD, 16, ops.BEST_FWD) == "v01"
    assert resolve_version("v01", ops.FWD, 128, ops.BEST_FWD) == "v01"
    assert resolve_version(None, ops.DECODE, 128, ("v01",)) == "v01"
    with pytest.raises(ValueError, match=r"head dim 32 is not supported by v02"):
        resolve_version(2, ops.FWD, 32, ops.BEST_FWD)
    with pytest.raises(ValueError, match=r"supported: \[16, 32, 64, 128\]"):
        resolve_version(None, ops.FWD, 256, ops.BEST_FWD)
    with pytest.raises(ValueError, match="unknown"):
        resolve_version("v3", ops.FWD, 64, ops.BEST_FWD)


def test_scale():
    assert op_common._scale(None, 64) == 0.125
    assert op_common._scale(None, 128) == pytest.approx(1 / math.sqrt(128))
    assert op_common._scale(2, 64) == 2.0 and isinstance(op_common._scale(2, 64), float)
    assert op_common._scale(0.3, 64) == 0.3
    for bad in (float("nan"), float("inf"), -float("inf"), True, "1", torch.tensor(0.5)):
        with pytest.raises(TypeError, match="scale must be a finite float or None"):
            op_common._scale(bad, 64)
    assert op_common._scale(0.0, 64) == 0.0 and op_common._scale(-0.125, 64) == -0.125  # SDPA takes any finite scale
    assert op_common._scale(3.4e38, 64) == 3.4e38
    for huge in (1e39, -1e39, 3.5e38):  # finite in Python, +-inf as the kernels' float32
        with pytest.raises(ValueError, match="overflows float32"):
            op_common._scale(huge, 64)


def test_decode_empty_batch_with_cache_seqlens(fake):
    """Batch 0 with cache_seqlens: an empty output, no host read of the (empty) lengths."""
    q, kc = fake(0, 8, 1, 128, dtype=BF16), fake(0, 2, 64, 128, dtype=BF16)
    out = ops.decode(q, kc, kc, torch.empty(0, dtype=torch.int32, device="cuda"))
    assert out.shape == (0, 8, 1, 128)


def test_num_splits_is_bounded():
    assert decode_op._num_splits(ops.MAX_NUM_SPLITS, 1, 8, 4096, None) == ops.MAX_NUM_SPLITS
    with pytest.raises(ValueError, match=r"num_splits must be an int in \[1, 1024\]"):
        decode_op._num_splits(ops.MAX_NUM_SPLITS + 1, 1, 8, 4096, None)


def test_num_splits_override_needs_no_gpu():
    assert decode_op._num_splits(5, 2, 8, 4096, None) == 5
    with pytest.raises(ValueError, match="num_splits"):
        decode_op._num_splits(0, 2, 8, 4096, None)


def test_kernel_tables_name_existing_sources():
    from lab import paths

    for table in (ops.FWD, ops.DECODE):
        for name, kernel in table.items():
            assert (paths.KERNELS / kernel.source).exists(), kernel.source
            assert kernel.symbol in (paths.KERNELS / kernel.source).read_text(), f"{kernel.symbol} not in {kernel.source}"


def test_decode_plan_is_memoised(fake, monkeypatch):
    """A decoding loop resolves kernel and split count once per shape, then one dict lookup per step."""
    decode_op._decode_plans.clear()
    calls = []
    resolve = decode_op._decode_version
    monkeypatch.setattr(decode_op, "_decode_version", lambda *a: calls.append(a) or resolve(*a))
    q, kc = fake(2, 8, 1, 128, dtype=BF16), fake(2, 2, 4096, 128, dtype=BF16)
    for _ in range(5):
        ops.decode(q, kc, kc, num_splits=4)
    default = registry.choose("decode", {"head_dim": 128, "heads_q": 8, "heads_kv": 2, "q_len": 1}).version
    assert len(calls) == 1 and decode_op._decode_plans[(q.shape, kc.shape, q.device, None, 4)] == (default, 4)
    ops.decode(fake(2, 8, 1, 128, dtype=BF16), fake(2, 2, 8192, 128, dtype=BF16), fake(2, 2, 8192, 128, dtype=BF16),
               num_splits=4)
    assert len(calls) == 2  # a new cache length is a new plan


def test_a_bad_shape_on_cpu_names_the_shape_before_the_device():
    """On a machine without a GPU a wrong call is first told what is wrong with its arguments; the device comes
    last, once every argument is right."""
    def t(*shape):
        return torch.zeros(*shape, dtype=F16)
    q = t(2, 4, 8, 64)
    cases = [
        (lambda: ops.attention(q, t(3, 4, 8, 64), t(3, 4, 8, 64)), r"key has batch 3 but query has batch 2"),
        (lambda: ops.attention(q, t(2, 4, 8, 32), t(2, 4, 8, 32)), r"key has head dim 32 but query has 64"),
        (lambda: ops.attention(q, t(2, 4, 8, 64), t(2, 4, 9, 64)), r"key and value shapes differ"),
        (lambda: ops.attention(q, t(2, 2, 8, 64), t(2, 2, 8, 64)), r"query has 4 heads but key has 2"),
        (lambda: ops.attention(q, t(2, 4, 0, 64), t(2, 4, 0, 64)), r"key has sequence length 0"),
        (lambda: ops.attention(q, t(3, 4, 8, 64), t(3, 4, 8, 64), window_size=(4, 0)), r"key has batch 3"),
        (lambda: ops.decode(t(2, 4, 1, 64), t(2, 3, 16, 64), t(2, 3, 16, 64)), r"multiple of key_cache heads \(3\)"),
        (lambda: ops.decode(t(2, 4, 1, 64), t(2, 4, 16, 64), t(2, 4, 15, 64)), r"key_cache and value_cache shapes"),
        (lambda: ops.decode(t(3, 8, 1, 128), t(4, 16, 2, 128), t(4, 16, 2, 128),
                            block_table=torch.zeros(2, 1, dtype=torch.int32)), r"block_table must have shape \(3,"),
    ]
    for call, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call()
    with pytest.raises(ValueError, match=r"query must be on a CUDA device, got cpu \(CPU mode: use lab.emulate\)"):
        ops.attention(q, q, q)  # a good call: now the device
    with pytest.raises(ValueError, match=r"query must be on a CUDA device"):
        ops.decode(q[:, :, :1], q, q)


@pytest.mark.parametrize("call, flag", [
    (lambda: ops.attention(_Q, _cpu(2, 2, 33, 64), _cpu(2, 2, 33, 64), enable_gqa="no"), "enable_gqa"),
    (lambda: ops.attention(_Q, _Q, _Q, enable_gqa=1), "enable_gqa"),
    (lambda: ops.attention(_Q, _Q, _Q, return_lse="yes"), "return_lse"),
    (lambda: ops.attention(_Q, _Q, _Q, softcap=5.0, return_lse="yes"), "return_lse"),
    (lambda: ops.attention_varlen(_VQ, _VQ, _VQ, _CU, _CU, 6, 6, check_cu_seqlens="no"), "check_cu_seqlens"),
    (lambda: ops.attention_varlen(_VQ, _VQ, _VQ, _CU, _CU, 6, 6, return_lse=1), "return_lse"),
    (lambda: ops.attention_fp8(*(_Q.to(torch.float8_e4m3fn),) * 3, enable_gqa="no"), "enable_gqa"),
    (lambda: ops.attention_fp8_train(_Q, _Q, _Q, return_lse="no"), "return_lse"),
])
def test_a_flag_that_is_not_a_bool_is_refused_as_sdpa_refuses_it(call, flag):
    """SDPA raises TypeError for enable_gqa="no" (truthy, so it would have run as True); the lab does too."""
    with pytest.raises(TypeError, match=rf"{flag} must be a bool, got"):
        call()


def test_a_symbolic_bool_of_torch_compile_counts_as_a_bool():
    from lab.masks import spec
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    heads = shape_env.create_unbacked_symint()
    spec.check_bools(enable_gqa=heads != 4, is_causal=True)  # a torch.SymBool: no error
    with pytest.raises(TypeError, match="enable_gqa must be a bool, got str"):
        spec.check_bools(enable_gqa="no")
