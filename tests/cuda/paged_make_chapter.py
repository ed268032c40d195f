"""Writes chapters/n11_paged_decode.ipynb (sources only, no outputs): python tests/cuda/paged_make_chapter.py"""
from __future__ import annotations

from chapter_writer import Chapter

chapter = Chapter("n11_paged_decode")
md, code = chapter.md, chapter.code


md(r"""
# n11 · Paged decoding, as serving engines call it

**What you will learn:** why serving engines keep the KV cache in pages, the page-major layout of vLLM and
`flash_attn_with_kvcache`, what changes in our split-K decode kernel to read through a block table (and
what does not), the bottom-right causal mask of speculative decoding, how a bad block table is caught on
the device without a host sync, and how the paged op races our contiguous decode and cuDNN.

## Why pages

A contiguous cache (B, H_kv, S_cache, D) reserves S_cache keys for every sequence up front: a server that
does not know how long each answer will be either wastes most of that memory or copies caches when they
grow. vLLM's PagedAttention cuts the cache into fixed-size pages drawn from one pool and gives each
sequence a list of page numbers, its row of the **block table**: memory is allocated a page at a time,
freed pages are reused by any sequence, and a shared prefix can point at the same pages.

## The layout

`key_cache`, `value_cache`: (num_pages, page_size, H_kv, D), page-major, as in vLLM and
`flash_attn_with_kvcache`; `block_table` (B, max_pages) int32; key j of sequence b is row j % page_size of
page block_table[b, j // page_size]. Within a page the H_kv heads of a key are adjacent, so one
(sequence, head) reads D·2 bytes every H_kv·D·2 bytes of a page: at page size 16 a head's 16 keys are
16 separate 256-byte runs (D 128), at 256 they are 256.

## Several new tokens: the bottom-right mask

Speculative decoding and chunked prefill append q_len tokens at once. With `is_causal=True`, token i of q_len
sees keys [0, len − q_len + i] (FlashAttention's rule: the last token sees the whole cache). This is **not**
`lab.ops.attention`'s `is_causal`, which is SDPA's top-left rule (query i sees keys j ≤ i): for 4 new
tokens after 1000 cached ones, top-left would let them see 1-4 keys.
""")

code(r'''
device = "auto"  # "auto" | "cuda" | "cpu"
dtype = "bfloat16"
cases = "full"  # "full" | "quick": quick races page size 64 only
''', tags=["parameters"])

code(r'''
import numpy as np
import torch
from lab import build, cases as case_sets, chapter, emulate_paged, findings, ops, paged, paths, plot, record, source
from lab.publish import tables
ours = paged.PUBLIC_DECODE  # every "ours" row times lab.ops.decode(..., block_table=...) exactly as users call it
ch = chapter.start("n11_paged_decode", device)
''')

md(r"""
## The layout in NumPy (CPU and GPU)

Two sequences of 40 and 100 keys in pages of 16 from a shuffled pool of 15 (3 spare): the block table, and
the first page of sequence 1 read back through it. `lab.emulate_paged.page_cache` builds the layout,
`gather_pages` undoes it.
""")

code(r'''
rng = np.random.default_rng(0)
k = rng.standard_normal((2, 2, 100, 8))
k_pages, v_pages, table = emulate_paged.page_cache(k, k, 16, rng, spare_pages=3)
print("pool", k_pages.shape, "(num_pages, page_size, H_kv, D)\nblock_table\n", table)
assert np.array_equal(emulate_paged.gather_pages(k_pages, table[1], 100), k[1])
print("sequence 1, key 17 lives in page", table[1, 17 // 16], "row", 17 % 16)
''')

md(r"""
## The algorithm, checked in NumPy (CPU and GPU)

`lab.emulate_paged.emulate_paged_decode` runs decode v03's algorithm in float64: splits of whole 64-key
tiles over the table's capacity (max_pages · page_size), keys found through the table tile by tile (a tile
crosses pages at page size 16 or 48; a split may start inside a page), an online softmax per split with a
per-row key limit (the causal mask), and the LSE merge of `n7_split_k`. Against attention on the
contiguous cache, on shuffled tables, ragged lengths with 0 and 1 (and fewer keys than new tokens), GQA
groups 1/4/8, q_len 1-8, causal and not, page sizes 16/48/64/256 and several split counts:
""")

code(r'''
worst = {}
for page, group, q_len, causal in np.ndindex(4, 3, 3, 2):
    page, group, q_len, causal = (16, 48, 64, 256)[page], (1, 4, 8)[group], (1, 3, 8)[q_len], bool(causal)
    rng = np.random.default_rng(page + 10 * group + q_len)
    q, k, v = (rng.standard_normal(s) for s in ((5, 2 * group, q_len, 16), (5, 2, 300, 16), (5, 2, 300, 16)))
    kp, vp, table = emulate_paged.page_cache(k, v, page, rng, spare_pages=2)
    ref, _, _ = emulate_paged.reference_paged_decode(q, kp, vp, table, [0, 1, 7, 257, 300], 0.25, causal)
    for splits in (1, 3, 16):
        out = emulate_paged.emulate_paged_decode(q, kp, vp, table, [0, 1, 7, 257, 300], splits, 0.25, causal)[0]
        worst[(page, causal)] = max(worst.get((page, causal), 0.0), float(np.abs(out - ref).max()))
for (page, causal), err in sorted(worst.items()):
    record.append({"kind": "emulation", "impl": "paged split-K (NumPy)", "page_size": page, "causal": causal, "max_abs": err})
    print(f"page {page:>3}{' causal' if causal else '       '}: max abs difference from the direct softmax {err:.1e}")
''')

md(r"""
## Bad block tables

A page id outside [0, num_pages), or a `cache_seqlens[b]` longer than the table holds (max_pages · page_size),
must never make the kernel read outside the cache, and must not go unnoticed. The op cannot look at the
table on the host without a synchronisation (which would break CUDA-graph capture), so the kernel checks:
every block reads the page ids of its sequence's whole length (about len / page_size int32 loads, while its
first tiles are in flight), a bad sequence gets O = 0 in every block, and `page_errors[b]` gets a bit per
reason (`LAB_PAGE_E_INDEX` = 1, `LAB_PAGE_E_SHORT` = 2) on every call. Pass `page_errors` (an int32 (B,)
tensor) to receive the flags with no host sync, as a serving loop or a graph does; without it an eager call
reads them after the kernel and raises `ValueError` naming the sequences. The rule, emulated:
""")

code(r'''
rng = np.random.default_rng(1)
q, k, v = rng.standard_normal((4, 4, 2, 16)), rng.standard_normal((4, 2, 64, 16)), rng.standard_normal((4, 2, 64, 16))
kp, vp, table = emulate_paged.page_cache(k, v, 16, rng)
table[1, 2] = kp.shape[0]  # past the pool
table[2, 3] = -1           # negative, but past sequence 2's 40 keys: never read
out, _, errors, _ = emulate_paged.emulate_paged_decode(q, kp, vp, table, [64, 64, 40, 65], 2, 0.25, True)
for b, e in enumerate(errors):
    print(f"sequence {b}: flags {e} {[emulate_paged.ERROR_NAMES[bit] for bit in (1, 2) if e & bit]}, output all zero: {bool((out[b] == 0).all())}")
''')

md(r"""
## The kernel change (decode v03)

`kernels/decode/v03_paged.cu` keeps decode v02's pass 1 (one block per (split, sequence, KV head, 16 query
rows), 64-key tiles by `cp.async` in a ring, `mma.sync` for Q Kᵀ and P V, warp-local online softmax) and
its split plan and combine. Three things are new: the tile loader's row address comes through the block
table, by a `PageCursor` (`kernels/common/paged.cuh`) that walks the block's tile 16 keys (one page id) at a
time with no division and fetches the next tile's page ids one tile ahead; the mask compares each key with its row's own
limit (bottom-right causal); and the page-table check above. Without a block table the same kernel reads
the contiguous cache (that is how `is_causal` with q_len > 1 runs on a contiguous cache). The loader:
""")

code(r'''
from IPython.display import Markdown
Markdown(source.markdown("common/paged.cuh", "page-cursor"))
''')

md("The main loop, with the per-row key limit:")

code(r'''
Markdown(source.markdown(ops.DECODE["v03"].source, "paged-loop"))
''')

md(r"""
Compiled for sm_80 and sm_90a here (nvcc, no GPU needed): registers, shared memory, spills per
instantiation (D 64/128 × fp16/bf16 × paged/contiguous).
""")

code(r'''
try:
    print(build.resource_table(build.compile_check(sources=[paths.KERNELS / ops.DECODE["v03"].source])))
except build.BuildError as err:  # no nvcc on this machine, or a compile error: say so, the rest still runs
    print(f"compile check not run: {str(err).splitlines()[0]}")
''')

md(r"""
## Checks (GPU)

Every `paged-tests` case (`lab.cases.paged_tests_cases`: page sizes 16/64/256 × GQA 1/4/8 × q_len 1/3/8 ×
causal and not, lengths 0, 1, 5, 63, 65, 1025, 4097 in one batch, fp16 D 64 and bf16 D 128) through
`lab.ops.decode(q, k_pages, v_pages, cache_seqlens, block_table=shuffled, is_causal=...)` against the
float64 reference on the contiguous cache the pages were cut from, judged by SDPA's error in the same dtype
(`lab.paged.check_paged`, `lab.check`'s rule); `page_errors` must come back 0. The self-test: the same
kernel built with `LAB_PAGED_BUG_IDENTITY` (slot i read as page i, the table ignored) must fail.
""")

code(r'''
if not ch.skip("paged decode checks"):
    results = [paged.check_paged(c) for c in case_sets.paged_tests_cases()]
    wrong = paged.check_paged(case_sets.paged_tests_cases()[2], "selftest: LAB_PAGED_BUG_IDENTITY",
                              defines={"LAB_PAGED_BUG_IDENTITY": None})
    display(tables.checks(results + [wrong]))
else:
    rows_chk = ch.recorded(kind="check")
    print(f"{sum(r['check']['passed'] for r in rows_chk)}/{len(rows_chk)} recorded checks passed" if rows_chk else "")
''')

md(r"""
## Captured in a CUDA graph (GPU)

`lab.ops.decode(q, k_pages, v_pages, cache_seqlens, block_table=table, page_errors=flags)` captured once with
`torch.cuda.graph`, then replayed after writing new lengths and new table contents into the captured
buffers: the lengths reversed, a reshuffled table over the same pool, and a table with a page id past the
pool (that sequence must come back zero and flagged). Each replay must equal an eager call bit for bit,
flags included, and pass the float64 check (`lab.paged.graph_check`).
""")

code(r'''
if not ch.skip("CUDA graph replays"):
    graph_rows = [paged.graph_check(c) for c in (case_sets.PagedCase("pg-graph-q4c", 4, 8, 2, 4, 1000, 128, dtype, (1000, 1, 0, 999), 64, True),
                                                 case_sets.PagedCase("pg-graph-p16", 3, 32, 8, 1, 4097, 128, dtype, (4097, 65, 300), 16))]
else:
    graph_rows = ch.recorded(kind="graph")
for r in graph_rows:
    print(r["case"]["name"], "PASS" if r["passed"] else "FAIL", [(x["bit_identical"], x["flags"]) for x in r["replays"]])
''')

md(r"""
## The race (GPU)

`bench-paged` (`lab.cases.bench_paged_cases`): Hq 32 over Hkv 8, D 128, q_len 1, batch 1/8/32 × 4k-32k keys
for page sizes 16, 64 and 256, plus q_len 4 causal at page 64. **Ours is the public op**
`lab.ops.decode(q, k_pages, v_pages, cache_seqlens, block_table=..., page_errors=flags)` on a shuffled table,
the graph-safe call with no host sync. Beside it on the same data: our contiguous decode
(`lab.ops.decode contiguous`, the same keys in a (B, H_kv, S, D) cache), SDPA's cuDNN and flash backends on
that contiguous cache, and the paged op without `page_errors` (`eager flag check`: one host sync a call).
""")

code(r'''
grid = case_sets.bench_paged_cases(dtype, page_sizes=(16, 64, 256) if cases == "full" else (64,))
if not ch.skip("bench-paged race"):
    rows = paged.paged_sweep(grid)
else:
    rows = [r for r in ch.recorded(kind="paged") if "timing" in r]
backends = (paged.CONTIGUOUS, "sdpa-cudnn", "sdpa-flash", paged.EAGER_CHECK)
tables.versus(rows, ours, "gbps", backends=backends) if rows else print("nothing recorded")
''')

code(r'''
if rows:
    one_token = [r for r in rows if r["case"]["q_len"] == 1 and r["impl"] != paged.EAGER_CHECK]
    plot.metric_vs_length(one_token, "gbps", length_key="tokens", split_keys=("page_size",), ylabel="GB/s",
                          ceiling=next((r["gbps"] / r["frac_ceiling"] for r in rows if r.get("frac_ceiling")), None),
                          title="paged decode bandwidth vs batch x length", path=record.figure_path("n11_gbps.png"));
''')

md("## Findings")

code(r'''
lines = []
for page in sorted({r["case"]["page_size"] for r in rows}):
    cells = [r for r in rows if r["case"]["page_size"] == page]
    lines += findings.ratio_summary(cells, ours, (paged.CONTIGUOUS, "sdpa-cudnn"), label=f"page {page}")
lines += findings.ceiling_summary([r for r in rows if r.get("cache_ge_1gb")], ours, "copy bandwidth (caches >= 1 GB)")
print("\n".join(lines) if lines else "no GPU results yet: the targets (>= 0.95x contiguous at pages 64/256, >= 0.85x at 16, "
      ">= 0.95x cuDNN, >= 90% of copy bandwidth at >= 1 GB) are open")
''')


def main():
    print(chapter.write())


if __name__ == "__main__":
    main()
