"""Bad direct calls of the binding (lab/binding.cpp), as data: each case is a set of arguments and the pattern of
the RuntimeError that must name the bad argument.

Used twice: tests/product/test_gpu.py runs them through the real binding on a GPU; tests/product/test_binding_checks.py runs the
same C++ checks on CPU tensors (binding.cpp built with LAB_BINDING_CPU_CHECKS, nothing launched). Cases that are
about the device itself (a CPU tensor among CUDA ones) are GPU-only.
"""
from __future__ import annotations

import math

import torch

GPU_ONLY = {"value_device", "lse_cpu", "seqlens_device"}


def _maker(device):
    def make(*shape, dtype=torch.float16):
        return torch.randn(*shape, device=device, dtype=dtype)
    return make


def fwd_args(device, B=2, Hq=4, Hkv=2, Sq=65, Sk=70, D=64):
    """A good forward call: dict of the binding's arguments after the launcher."""
    r = _maker(device)
    q = r(B, Hq, Sq, D)
    return dict(q=q, k=r(B, Hkv, Sk, D), v=r(B, Hkv, Sk, D), o=torch.empty_like(q), lse=None, scale=0.125,
                causal=False)


def fwd_bad(device) -> dict:
    """name -> (changes to fwd_args(device), error pattern)."""
    r = _maker(device)
    f32 = dict(device=device, dtype=torch.float32)
    return {
        "batch": (lambda a: {"k": r(3, 2, 70, 64), "v": r(3, 2, 70, 64)}, r"key has batch 3 but query has batch 2"),
        "head_dim": (lambda a: {"k": r(2, 2, 70, 32), "v": r(2, 2, 70, 32)}, r"key has head dim 32"),
        "heads": (lambda a: {"k": r(2, 3, 70, 64), "v": r(2, 3, 70, 64)}, r"multiple of key heads \(3\)"),
        "hkv0": (lambda a: {"k": r(2, 0, 70, 64), "v": r(2, 0, 70, 64)}, r"key must have at least one head"),
        "d0": (lambda a: {"q": r(2, 4, 65, 0), "o": r(2, 4, 65, 0), "k": r(2, 2, 70, 0), "v": r(2, 2, 70, 0)},
               r"query head dim must be positive"),
        "kv_shapes": (lambda a: {"v": a["v"][:, :, :60]}, r"key and value shapes differ"),
        "rank": (lambda a: {"k": a["k"][0]}, r"key must be 4-D"),
        "dtype": (lambda a: {"q": a["q"].float(), "o": a["o"].float(), "k": a["k"].float(), "v": a["v"].float()},
                  r"query dtype must be float16 or bfloat16"),
        "out_shape": (lambda a: {"o": a["o"][:, :, :10]}, r"out must have the query's shape"),
        "out_dtype": (lambda a: {"o": a["o"].bfloat16()}, r"out has dtype BFloat16 but query has Half"),
        "out_stride0": (lambda a: {"o": r(1, 4, 65, 64).expand(2, 4, 65, 64)}, r"out has a stride of 0"),
        "out_overlaps_query": (lambda a: {"o": a["q"]}, r"out overlaps query"),
        "lse_numel": (lambda a: {"lse": torch.empty(2, 4, 64, **f32)}, r"lse must have 520 elements"),
        "lse_dtype": (lambda a: {"lse": torch.empty(2, 4, 65, device=device, dtype=torch.float16)},
                      r"lse must be float32"),
        "scale_inf": (lambda a: {"scale": math.inf}, r"scale must be a finite float32"),
        "scale_nan": (lambda a: {"scale": math.nan}, r"scale must be a finite float32"),
        "scale_overflow": (lambda a: {"scale": 1e39}, r"scale must be a finite float32"),
        "value_device": (lambda a: {"v": a["v"].cpu()}, r"value must be a CUDA tensor"),
        "lse_cpu": (lambda a: {"lse": torch.empty(2, 4, 65)}, r"lse must be a CUDA tensor"),
    }


def dec_args(device, B=2, Hq=8, Hkv=2, T=1, S=300, D=128, splits=3):
    """A good decode call: dict of the binding's arguments after the launcher."""
    r = _maker(device)
    q = r(B, Hq, T, D, dtype=torch.bfloat16)
    return dict(q=q, k=r(B, Hkv, S, D, dtype=torch.bfloat16), v=r(B, Hkv, S, D, dtype=torch.bfloat16),
                o=torch.empty_like(q), lens=torch.full((B,), S, dtype=torch.int32, device=device),
                po=torch.empty(B, Hq, T, splits, D, device=device), pl=torch.empty(B, Hq, T, splits, device=device),
                lse=None, scale=0.1, splits=splits)


def decode_bad(device) -> dict:
    """name -> (changes to dec_args(device), error pattern)."""
    def bf(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)
    f32 = dict(device=device, dtype=torch.float32)
    return {
        "batch": (lambda a: {"k": bf(3, 2, 300, 128), "v": bf(3, 2, 300, 128)}, r"key_cache has batch 3"),
        "head_dim": (lambda a: {"k": bf(2, 2, 300, 64), "v": bf(2, 2, 300, 64)}, r"key_cache has head dim 64"),
        "heads": (lambda a: {"k": bf(2, 3, 300, 128), "v": bf(2, 3, 300, 128)}, r"multiple of key_cache heads"),
        "hkv0": (lambda a: {"k": bf(2, 0, 300, 128), "v": bf(2, 0, 300, 128)},
                 r"key_cache must have at least one head"),
        "d0": (lambda a: {"q": bf(2, 8, 1, 0), "o": bf(2, 8, 1, 0), "k": bf(2, 2, 300, 0), "v": bf(2, 2, 300, 0)},
               r"head dim must be positive"),
        "splits0": (lambda a: {"splits": 0}, r"num_splits must be in \[1, 1024\]"),
        "splits_max": (lambda a: {"splits": 1025}, r"num_splits must be in \[1, 1024\]"),
        # 64 x 64 x 16 rows x 1024 splits x 128 > 2^31 (expanded views: nothing large is allocated)
        "splits_int32": (lambda a: {"q": bf(1, 1, 1, 128).expand(64, 64, 16, 128),
                                    "o": bf(1, 1, 1, 128).expand(64, 64, 16, 128),
                                    "k": bf(1, 1, 1, 128).expand(64, 8, 300, 128),
                                    "v": bf(1, 1, 1, 128).expand(64, 8, 300, 128), "lens": None, "splits": 1024},
                         r"num_splits = 1024 is too large for this shape.*must fit in int32"),
        "partial_o_small": (lambda a: {"po": torch.empty(2, 8, 1, 2, 128, **f32)}, r"partial_o must have at least"),
        "partial_lse_dtype": (lambda a: {"pl": a["pl"].half()}, r"partial_lse must be float32"),
        "partial_lse_strided": (lambda a: {"pl": torch.empty(2, 8, 1, 6, **f32)[..., ::2]},
                                r"partial_lse must be contiguous"),
        "lse": (lambda a: {"lse": torch.empty(2, 7, **f32)}, r"lse must have 16 elements"),
        "lse_dtype": (lambda a: {"lse": torch.empty(2, 8, 1, device=device, dtype=torch.float16)},
                      r"lse must be float32"),
        "seqlens_dtype": (lambda a: {"lens": a["lens"].long()}, r"cache_seqlens must be a contiguous int32"),
        "seqlens_shape": (lambda a: {"lens": torch.zeros(3, dtype=torch.int32, device=device)},
                          r"cache_seqlens must be a contiguous int32 tensor of shape \(2,\)"),
        "scale": (lambda a: {"scale": math.inf}, r"scale must be a finite float32"),
        "out_stride0": (lambda a: {"o": bf(2, 8, 1, 128)[:1].expand(2, 8, 1, 128)}, r"out has a stride of 0"),
        "seqlens_device": (lambda a: {"lens": a["lens"].cpu()}, r"cache_seqlens must be a CUDA tensor"),
    }


def call_fwd(bind, address, a):
    bind.attn_fwd(address, a["q"], a["k"], a["v"], a["o"], a["lse"], a["scale"], a["causal"], None)


def call_decode(bind, address, a):
    bind.decode_fwd(address, a["q"], a["k"], a["v"], a["o"], a["lens"], a["po"], a["pl"], a["lse"], a["scale"],
                    a["splits"])
