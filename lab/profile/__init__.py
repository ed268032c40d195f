"""Nsight Compute through the lab: profile one launch, read its counters, say what bounds it.

A kernel's fraction of a ceiling (lab.bench) says which floor it is near, not why it is far from it.
Here one launch of a registered kernel (or of an SDPA backend) on a named case runs in a child
process under `ncu --clock-control none` (the clocks are left alone), with a kernel-name filter,
`--launch-skip` warm-ups and one profiled launch. The report is read through ncu's own CSV export of
the raw page (never the text page), reduced to a row of metrics, recorded with the kernel's source
hash and the case, and judged by a decision tree whose thresholds are data (lab.profile.tree.TREE).

    python -m lab.profile fwd:v04 fwd-d128-s2048        # or decode:v02, op:attention, sdpa:flash
    python -m lab.profile bwd:v02 bwd-d128-s4096        # or sdpa-bwd:cudnn: the backward beside cuDNN's
Targets: fwd:<version> and decode:<version> (lab.ops.FWD / DECODE), op:attention and op:decode (the
public ops, default kernel), sdpa:<backend> (flash, cudnn, efficient, math; a decode case runs SDPA
on the one new token against the cache).

The package: targets (what a profile launches and its floors), ncu (running Nsight Compute, one record per
profile), counters (reading the report), tree (the verdict), report (chapter n8's tables and figures);
`python -m lab.profile` is __main__. The names below are the public ones.
"""
from .counters import TENSOR_SOURCES, parse_raw_csv, source_regions, summarize  # noqa: F401
from .ncu import (EXTRA_METRICS, MAX_KEPT_REP_BYTES, NVTX_RANGE, RUN_REP_BUDGET, SECTIONS,  # noqa: F401
                  ProfileUnavailable, explain_failure, export_raw, find_ncu, host_call_us, measure, ncu_command,
                  ncu_version, recorded, row_from_raw, run_ncu)
from .report import (FIXTURES, KNOWN_ANSWERS, check_fixtures, known_answers, markdown, measure_all, plan,  # noqa: F401
                     recorded_ceilings, roofline, stall_chart, table)
from .targets import (SDPA_BWD_KERNELS, SDPA_KERNELS, byte_floor, find_case, kernel_regex, kernel_source,  # noqa: F401
                      make_call, parse_target, work_flops)
from .tree import ACTIONS, TREE, decide  # noqa: F401
