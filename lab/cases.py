"""Named case sets: the shapes every chapter checks and times.

Layout is SDPA's (B, H, S, D). `Hq` query heads share `Hkv` key/value heads (GQA when Hkv < Hq).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Case:
    name: str
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    dtype: str = "float16"
    causal: bool = False

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        mask = " causal" if self.causal else ""
        gqa = f"/{self.Hkv}" if self.Hkv != self.Hq else ""
        return f"B{self.B} H{self.Hq}{gqa} Sq{self.Sq} Sk{self.Sk} D{self.D} {self.dtype}{mask}"


@dataclass(frozen=True)
class DecodeCase:
    """q_len new tokens per sequence attend to a KV cache; `seqlens` gives each sequence's length."""

    name: str
    B: int
    Hq: int
    Hkv: int
    q_len: int
    kv_len: int  # cache capacity S_cache
    D: int = 128
    dtype: str = "bfloat16"
    seqlens: tuple = field(default=())  # per-sequence lengths; empty: every sequence is kv_len long

    def as_dict(self) -> dict:
        return asdict(self)

    def lengths(self) -> list[int]:
        return list(self.seqlens) if self.seqlens else [self.kv_len] * self.B

    @property
    def label(self) -> str:
        lens = "mixed" if self.seqlens else str(self.kv_len)
        return f"B{self.B} Hq{self.Hq}/{self.Hkv} q{self.q_len} kv{lens} D{self.D} {self.dtype}"


# (B, Hq, Hkv, Sq, Sk, D): uneven sizes, Sq != Sk both ways, batch and heads not powers of two, GQA, MQA.
_TEST_SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (3, 5, 5, 63, 63, 128),
    (2, 3, 3, 65, 65, 64),
    (1, 2, 2, 1025, 1025, 128),
    (1, 1, 1, 4097, 4097, 64),
    (2, 4, 4, 63, 1025, 64),
    (1, 4, 4, 1025, 65, 128),
    (3, 6, 2, 65, 130, 128),
    (1, 8, 1, 1, 4097, 64),
]


def tests_cases(head_dims: tuple = (64, 128)) -> list[Case]:
    """The correctness set: every shape x causal x {fp16, bf16}, restricted to the given head dims."""
    cases = []
    for (B, Hq, Hkv, Sq, Sk, D) in _TEST_SHAPES:
        if D not in head_dims:
            D = head_dims[-1]
        for dtype in ("float16", "bfloat16"):
            for causal in (False, True):
                name = f"t-{B}x{Hq}x{Hkv}-{Sq}x{Sk}-d{D}-{dtype[:2]}{'-c' if causal else ''}"
                cases.append(Case(name, B, Hq, Hkv, Sq, Sk, D, dtype, causal))
    return cases


# The origin's six configurations (seeds/000): named by S, all D=64 fp16. The reports do not state B
# and H; we fix B=4, H=8 for all of them and H=16 for the multi-head row (S=128), and keep them fixed.
SEED_B, SEED_H, SEED_MULTI_H = 4, 8, 16
SEED_ORIGIN_L4 = {  # PyTorch ms, ours ms, speedup, as reported on the L4 (seeds/000, 2025-10-12)
    "Tiny": (32, 0.043, 0.155, 0.28),
    "Small": (64, 0.044, 0.286, 0.15),
    "Medium": (128, 0.044, 0.743, 0.06),
    "Large": (256, 0.044, 2.801, 0.02),
    "XLarge": (512, 0.052, 8.290, 0.01),
    "Multi-head": (128, 0.043, 0.746, 0.06),
}


def seed_cases(dtype: str = "float16") -> list[Case]:
    cases = []
    for name, (S, *_rest) in SEED_ORIGIN_L4.items():
        H = SEED_MULTI_H if name == "Multi-head" else SEED_H
        cases.append(Case(name, SEED_B, H, H, S, S, 64, dtype, False))
    return cases


def _token_grid(prefix: str, tokens: int, dtype: str, head_dims, seqlens) -> list[Case]:
    """B*S = tokens, H*D = 2048, causal and not: every cell does the same non-causal work per token."""
    return [Case(f"{prefix}-d{D}-s{S}{'-c' if causal else ''}", tokens // S, 2048 // D, 2048 // D, S, S, D, dtype, causal)
            for D in head_dims for S in seqlens for causal in (False, True)]


def bench_fwd_cases(dtype: str = "bfloat16", head_dims=(64, 128), seqlens=(512, 2048, 8192, 16384)) -> list[Case]:
    """B*S = 32k tokens, H*D = 2048: every cell does the same non-causal work per token."""
    return _token_grid("fwd", 32768, dtype, head_dims, seqlens)


def bench_bwd_cases(dtype: str = "bfloat16", head_dims=(64, 128), seqlens=(512, 1024, 2048, 4096, 8192, 16384)
                    ) -> list[Case]:
    """The backward's race: B*S = 16k tokens, H*D = 2048, causal and not, plus GQA 32/8 and an odd length."""
    cases = _token_grid("bwd", 16384, dtype, head_dims, seqlens)
    cases.append(Case("bwd-d128-s4096-gqa-c", 4, 32, 8, 4096, 4096, 128, dtype, True))
    cases.append(Case("bwd-d128-s4097-c", 4, 16, 16, 4097, 4097, 128, dtype, True))
    return cases


def head_dim_cases(dtype: str = "bfloat16", head_dims=(32, 80, 96), seqlens=(512, 2048, 8192)) -> list[Case]:
    """Head dims without a kernel of their own (on Hopper read unpadded by the next width's kernels, forward and
    backward; zero-padded to it elsewhere): B*S = 16k tokens, H = 2048 // D, causal and not."""
    return _token_grid("hd", 16384, dtype, head_dims, seqlens)


def wide_head_dim_cases(dtype: str = "bfloat16", head_dims=(192, 256), seqlens=(512, 2048, 8192)) -> list[Case]:
    """Head dims above 128 (fwd v10, forward only): B*S = 16k tokens, H = 16 (H*D = 3072 / 4096), causal and
    not, plus Gemma-2's GQA (16 query heads over 8) at D = 256 and one padded width (200, run at 256)."""
    cases = [Case(f"hdw-d{D}-s{S}{'-c' if causal else ''}", 16384 // S, 16, 16, S, S, D, dtype, causal)
             for D in head_dims for S in seqlens for causal in (False, True)]
    cases.append(Case("hdw-d256-s4096-gqa-c", 4, 16, 8, 4096, 4096, 256, dtype, True))
    cases.append(Case("hdw-d200-s2048", 8, 16, 16, 2048, 2048, 200, dtype, False))
    return cases


def bench_fwd_fp16_cases() -> list[Case]:
    """One fp16 cell beside the bf16 grid: the same kernel path with the other dtype."""
    return [Case("fwd-d128-s4096-fp16", 8, 16, 16, 4096, 4096, 128, "float16", False)]


# KV bytes above this are skipped: batch 64 x 64k keys x 32 heads would be 69 GB of cache.
DECODE_MAX_KV_BYTES = 9 * 2**30


def bench_decode_cases(dtype: str = "bfloat16", kv_lens=(4096, 16384, 32768, 65536), batches=(1, 8, 64),
                       kv_heads=(32, 8), max_kv_bytes: int = DECODE_MAX_KV_BYTES) -> list[DecodeCase]:
    cases = []
    for Hkv in kv_heads:
        for B in batches:
            for L in kv_lens:
                case = DecodeCase(f"dec-h{Hkv}-b{B}-kv{L}", B, 32, Hkv, 1, L, 128, dtype)
                if decode_kv_bytes(case) <= max_kv_bytes:
                    cases.append(case)
    return cases


def decode_long_cases(dtype: str = "bfloat16") -> list[DecodeCase]:
    """The cells where lab.ops.decode lost most to its host path (BUG-002): batch 1 at 128k keys, and
    64 query heads over 8 KV heads at batch 4."""
    return [DecodeCase("dec-h8-b1-kv131072", 1, 32, 8, 1, 131072, 128, dtype),
            DecodeCase("dec-h32-b1-kv131072", 1, 32, 32, 1, 131072, 128, dtype),
            DecodeCase("dec-h8-b4-kv16384-hq64", 4, 64, 8, 1, 16384, 128, dtype)]


def decode_tests_cases() -> list[DecodeCase]:
    """Uneven cache lengths, GQA, several q_len and head dims, both dtypes."""
    lens = (1, 63, 65, 1025, 4097)
    cases = []
    for dtype in ("float16", "bfloat16"):
        for (Hq, Hkv, q_len, D) in ((32, 8, 1, 128), (6, 2, 4, 64), (8, 8, 16, 128), (4, 1, 1, 64)):
            cases.append(DecodeCase(f"dt-{Hq}x{Hkv}-q{q_len}-d{D}-{dtype[:2]}", len(lens), Hq, Hkv, q_len,
                                    max(lens), D, dtype, lens))
    return cases


@dataclass(frozen=True)
class PagedCase(DecodeCase):
    """A decode case on a paged cache (lab.ops.decode with block_table): the cache cut into page_size-key
    pages behind a shuffled block table (lab.decode.paged); causal is bottom-right (token i of q_len sees keys
    [0, len - q_len + i]). kv_len is the longest sequence; the table holds ceil(kv_len / page_size) pages
    per sequence."""

    page_size: int = 64
    causal: bool = False

    @property
    def label(self) -> str:
        mask = " causal" if self.causal else ""
        return super().label.replace(f" D{self.D} ", f" page{self.page_size} D{self.D} ") + mask


PAGE_SIZES = (16, 64, 256)


def paged_tests_cases(head_dims=(128, 64)) -> list[PagedCase]:
    """The paged decode's checks: page sizes 16/64/256, GQA 1/4/8 (H_kv 8 and 2: decode v04 and v03), q_len
    1/3/8, causal and not, ragged lengths including 0 and 1 (and fewer keys than new tokens), fp16 and bf16, D 128
    and 64 (bf16 at head_dims[0], fp16 at head_dims[-1]: a version of other head dims gets the same grid)."""
    lens = (0, 1, 5, 63, 65, 1025, 4097)
    cases = []
    for i, (page, (Hq, Hkv), q_len, causal) in enumerate(
            (p, g, t, c) for p in PAGE_SIZES for g in ((8, 8), (8, 2), (16, 2), (32, 8)) for t in (1, 3, 8)
            for c in (False, True)):
        dtype, D = ("bfloat16", head_dims[0]) if i % 2 == 0 else ("float16", head_dims[-1])
        name = f"pt-p{page}-{Hq}x{Hkv}-q{q_len}{'-c' if causal else ''}-d{D}-{dtype[:2]}"
        cases.append(PagedCase(name, len(lens), Hq, Hkv, q_len, max(lens), D, dtype, lens, page, causal))
    return cases


# (batch, length) of the paged race: a serving engine's shapes from many short sequences to one long one,
# 0.27-1.07 GB of K and V (bf16, Hkv 8, D 128)
PAGED_CELLS = ((64, 1024), (32, 4096), (8, 16384), (1, 131072), (128, 2048))


def bench_paged_cases(dtype: str = "bfloat16", page_sizes=PAGE_SIZES, cells=PAGED_CELLS,
                      max_kv_bytes: int = DECODE_MAX_KV_BYTES) -> list[PagedCase]:
    """The race of chapter n11: Hq 32 over Hkv 8, D 128, q_len 1, each (batch, length) cell for each page size;
    plus speculative decoding (q_len 4, causal) at page 64, batch 8, 4k and 16k keys."""
    cases = []
    for page in page_sizes:
        for B, L in cells:
            case = PagedCase(f"pg-p{page}-b{B}-kv{L}", B, 32, 8, 1, L, 128, dtype, (), page)
            if 2 * B * case.Hkv * L * case.D * 2 <= max_kv_bytes:
                cases.append(case)
    for L in (4096, 16384):
        cases.append(PagedCase(f"pg-p64-b8-kv{L}-q4c", 8, 32, 8, 4, L, 128, dtype, (), 64, True))
    return cases


# The decode kernels' head dims (lab.registry.DECODE_HEAD_DIMS; kept here as data, lab.cases imports no registry)
DECODE_HEAD_DIMS = (64, 80, 96, 128, 192, 256)


def paged_head_dim_tests_cases(head_dims=DECODE_HEAD_DIMS) -> list[PagedCase]:
    """The paged decode at every head dim: pages 16 / 64 / 256 (shuffled), GQA 4 over H_kv 8, MHA 16/16 and GQA 3
    with q_len 3 bottom-right causal, lengths 0-4097 in one batch, bf16 and fp16."""
    lens = (0, 1, 5, 63, 65, 1025, 4097)
    shapes = ((16, 32, 8, 1, False, "bfloat16"), (64, 6, 2, 3, True, "float16"), (256, 16, 16, 1, False, "bfloat16"))
    return [PagedCase(f"hd-pt-d{D}-p{page}-{Hq}x{Hkv}-q{q_len}{'-c' if causal else ''}", len(lens), Hq, Hkv, q_len,
                      max(lens), D, dtype, lens, page, causal)
            for D in head_dims for page, Hq, Hkv, q_len, causal, dtype in shapes]


def decode_head_dim_tests_cases(head_dims=DECODE_HEAD_DIMS) -> list[DecodeCase]:
    """The contiguous decode at every head dim: lengths 1-4097, GQA 4, one row per KV head (8/8), q_len 3 over 6/2."""
    lens = (1, 63, 65, 1025, 4097)
    return [DecodeCase(f"hd-dt-d{D}-{Hq}x{Hkv}-q{q_len}-{dtype[:2]}", len(lens), Hq, Hkv, q_len, max(lens), D, dtype, lens)
            for D in head_dims for (Hq, Hkv, q_len, dtype) in ((32, 8, 1, "bfloat16"), (8, 8, 1, "float16"),
                                                                (6, 2, 3, "bfloat16"))]


def bench_paged_head_dim_cases(dtype: str = "bfloat16", head_dims=DECODE_HEAD_DIMS, cells=((8, 16384), (128, 2048)),
                               page_size: int = 64) -> list[PagedCase]:
    """The head-dim race of chapter n11: Hq 32 over Hkv 8, one token, pages of 64, a split cell (8 x 16384) and a
    one-wave cell (128 x 2048: 0.67-2.1 GB of K and V from D 80 to 256) at each head dim."""
    return [PagedCase(f"hd-p{page_size}-d{D}-b{B}-kv{L}", B, 32, 8, 1, L, D, dtype, (), page_size)
            for D in head_dims for B, L in cells]


def decode_kv_bytes(case: DecodeCase) -> int:
    element = 2
    return 2 * sum(case.lengths()) * case.Hkv * case.D * element


def by_name(name: str, **kwargs) -> list:
    """Case sets by their published names: tests, seed, bench-fwd, bench-bwd, bench-decode, decode-long,
    decode-tests, paged-tests, bench-paged, paged-head-dims-tests, decode-head-dims-tests, bench-paged-head-dims."""
    table = {"tests": tests_cases, "seed": seed_cases, "bench-fwd": bench_fwd_cases, "bench-fwd-fp16": bench_fwd_fp16_cases,
             "bench-bwd": bench_bwd_cases,
             "bench-decode": bench_decode_cases, "decode-long": decode_long_cases, "decode-tests": decode_tests_cases,
             "paged-tests": paged_tests_cases, "bench-paged": bench_paged_cases,
             "paged-head-dims-tests": paged_head_dim_tests_cases, "decode-head-dims-tests": decode_head_dim_tests_cases,
             "bench-paged-head-dims": bench_paged_head_dim_cases}
    if name not in table:
        raise ValueError(f"unknown case set {name!r}; choose one of {sorted(table)}")
    return table[name](**kwargs)
