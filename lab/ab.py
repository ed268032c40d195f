"""An A/B of two candidates of one kernel family over named cases: each case checked first, then both timed in rounds.

A candidate is a version of the family's kernel table (lab.registry), or "default" (what the public call picks),
called exactly as users call it, with the options of that call that leave the result unchanged (decode's
num_splits, the backward's deterministic mode): so an A/B compares two versions, or two variants of one version.
A forward A/B may also name a peer (PEERS: SDPA forced to one backend, the backend entered outside the timer as
the lab's races do), so a question about where the lab stands against cuDNN is an experiment like any other.
A candidate is timed on a case only after it passed lab.check's correctness rule there. Timing is
lab.bench.time_interleaved: every round times A then B, so a drift of the GPU's clocks reaches both alike.
chapters/x_ab.ipynb runs it (`python -m lab experiment x_ab -p family fwd -p candidate_a v03 ...`) and writes the
experiment record (lab.experiments); without a GPU it checks the plan and compiles the two kernels only.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import cases as case_sets
from . import experiments, record, registry
from .publish.tables import Table

TABLES = {"fwd": registry.FWD, "decode": registry.DECODE, "bwd": registry.BWD}  # families with an A/B adapter
OPTIONS = {"fwd": (), "decode": ("num_splits",), "bwd": ("deterministic",)}  # options that keep the result
CASE_SETS = {"fwd": ("tests", "seed", "bench-fwd", "bench-fwd-fp16", "bench-bwd", "head-dims", "wide-head-dims"),
             "bwd": ("tests", "bench-bwd", "bench-fwd", "head-dims"),
             "decode": ("decode-tests", "bench-decode", "decode-long", "decode-head-dims-tests")}
HEAD_DIM_SETS = {"head-dims": case_sets.head_dim_cases, "wide-head-dims": case_sets.wide_head_dim_cases}  # not in by_name
PEERS = {"fwd": {"sdpa-cudnn": "cudnn", "sdpa-flash": "flash"}}  # name -> SDPA backend, per family
METRIC = "median time of one call (CUDA events, L2 flushed, A and B timed in alternating rounds)"


@dataclass(frozen=True)
class Candidate:
    family: str
    version: str | None  # None: the version the public call picks
    options: tuple = ()  # sorted (name, value) pairs

    @property
    def peer(self) -> str | None:
        """The SDPA backend this candidate forces, when it is a peer rather than a version of ours."""
        return PEERS.get(self.family, {}).get(self.version or "")

    @property
    def name(self) -> str:
        return " ".join([self.version or "default", *(f"{k}={v}" for k, v in self.options)])

    def supports(self, case, capability: tuple | None = None) -> str | None:
        """Why this candidate cannot run the case (head dim, GPU), or None. capability None: not known yet."""
        if self.version is None or self.peer:
            return None
        kernel = TABLES[self.family][self.version]
        if case.D not in kernel.head_dims:
            return f"{self.version} takes head dims {list(kernel.head_dims)}, not {case.D}"
        if capability is not None and kernel.capabilities and tuple(capability) not in kernel.capabilities:
            return f"{self.version} runs on compute capability {kernel.capabilities}, not {tuple(capability)}"
        return None


def candidate(family: str, version, options: dict | None = None) -> Candidate:
    """A checked candidate: ValueError names the family, version or option that does not exist."""
    if family not in TABLES:
        raise ValueError(f"family {family!r} has no A/B adapter; these have one: {', '.join(TABLES)}")
    name = None if version in (None, "", "default") else str(version)
    peers = PEERS.get(family, {})
    if name is not None and name not in TABLES[family] and name not in peers:
        raise ValueError(f"{family} has no version {name!r}; its versions: {', '.join(TABLES[family])}"
                         + (f"; its peers: {', '.join(peers)}" if peers else ""))
    if name in peers and options:
        raise ValueError(f"{family}: a peer ({name}) takes no options")
    unknown = sorted(set(options or {}) - set(OPTIONS[family]))
    if unknown:
        raise ValueError(f"{family}: option(s) {unknown} not allowed; allowed: {list(OPTIONS[family]) or 'none'}")
    return Candidate(family, name, tuple(sorted((options or {}).items())))


def _case_set(name: str) -> list:
    return HEAD_DIM_SETS[name]() if name in HEAD_DIM_SETS else case_sets.by_name(name)


def cases(family: str, names) -> list:
    """Cases by name from the family's case sets (lab.cases); a case set's name stands for all its cases."""
    names = [names] if isinstance(names, str) else list(names)
    known = {}
    for set_name in CASE_SETS[family]:
        for case in _case_set(set_name):
            known.setdefault(case.name, case)
    found = []
    for name in names:
        if name in CASE_SETS[family]:
            found += _case_set(name)
        elif name in known:
            found.append(known[name])
        else:
            raise ValueError(f"no {family} case named {name!r} in the case sets {', '.join(CASE_SETS[family])}")
    return list(dict.fromkeys(found))


def plan(a: Candidate, b: Candidate, chosen: list, gpu: bool = False) -> Table:
    """Which candidate runs which case, on this GPU when `gpu` (CPU mode shows it before any GPU time is spent)."""
    if a == b:
        raise ValueError(f"A and B are the same candidate ({a.name}): nothing to compare")
    capability = None
    if gpu:
        import torch

        capability = tuple(torch.cuda.get_device_capability())
    rows = [[c.name, c.label, a.supports(c, capability) or "runs", b.supports(c, capability) or "runs"] for c in chosen]
    return Table(["case", "shape", f"A: {a.name}", f"B: {b.name}"], rows, f"{a.family} A/B over {len(chosen)} case(s)")


def slug(a: Candidate, b: Candidate) -> str:
    """The id's slug of an A/B (what `python -m lab experiment x_ab` names it too)."""
    return f"ab-{a.family}-{a.name}-{b.name}".replace(" ", "-").replace("=", "")


def sources(a: Candidate, b: Candidate) -> list:
    """The kernel sources of the named versions (for the compile check)."""
    from . import paths

    return list(dict.fromkeys(paths.KERNELS / TABLES[c.family][c.version].source for c in (a, b)
                              if c.version and not c.peer))


def _call(cand: Candidate, case, seed: int = 0):
    """A zero-argument call of the public path on fresh inputs, and the lab.check runner of the same path."""
    import torch

    from . import backward, bench, ops, sweep
    from .backward import harness

    opts = dict(cand.options)
    if cand.family == "decode":
        q, k, v, seqlens = sweep.case_inputs(case, seed)
        check_run = lambda q_, k_, v_, s_, scale, out: out.copy_(  # noqa: E731
            ops.decode(q_, k_, v_, s_, scale=scale, version=cand.version, **opts))
        return (lambda: ops.decode(q, k, v, seqlens, version=cand.version, **opts)), check_run
    q, k, v, causal = sweep.case_inputs(case, seed)
    gqa = q.shape[1] != k.shape[1]
    if cand.peer:  # SDPA in torch's default dispatch; run() enters the backend around each timed call
        import torch.nn.functional as F

        check_run = lambda q_, k_, v_, causal_, scale, out: out.copy_(bench.sdpa_runner(  # noqa: E731
            cand.peer, q_, k_, v_, is_causal=causal_, scale=scale)())
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)), check_run
    if cand.family == "fwd":
        check_run = lambda q_, k_, v_, causal_, scale, out: out.copy_(  # noqa: E731
            ops.attention(q_, k_, v_, is_causal=causal_, scale=scale, enable_gqa=gqa, version=cand.version))
        return (lambda: ops.attention(q, k, v, is_causal=causal, enable_gqa=gqa, version=cand.version)), check_run
    det = bool(opts.get("deterministic", False))
    name = backward.backward_version(case.D, cand.version, tuple(torch.cuda.get_device_capability()), det)
    with torch.no_grad():
        out, lse = ops.attention(q, k, v, is_causal=causal, enable_gqa=gqa, return_lse=True)
    dout, scale = torch.randn_like(out), case.D ** -0.5
    call = lambda: backward._bwd_impl(dout, q, k, v, out, lse, None, causal, scale, det, name)  # noqa: E731
    return call, harness.bwd_runner(name, deterministic=det)


def _check(cand: Candidate, case, run, trials: int):
    from . import check

    if cand.family == "bwd":
        results = check.check_backward(run, case, f"ab {cand.name}", trials=trials, save=False)
        return all(r.passed for r in results.values()), max(r.worst["max_abs"] for r in results.values())
    checker = check.check_decode if cand.family == "decode" else check.check_forward
    result = checker(run, case, f"ab {cand.name}", trials=trials, save=False)
    return result.passed, result.worst["max_abs"]


def run(a: Candidate, b: Candidate, chosen: list, trials: int = 2, **stop) -> list[dict]:
    """Per case: each candidate checked (passed, worst max abs error), then those that passed timed in rounds.

    {case, checks: {name: (passed, max_abs) or why it cannot run}, times: {name: lab.bench.Timing or why not}}."""
    import torch

    from . import bench

    capability = tuple(torch.cuda.get_device_capability())
    rows = []
    for case in chosen:
        checks, calls = {}, {}
        for cand in (a, b):
            why = cand.supports(case, capability)
            if why:
                checks[cand.name] = why
                continue
            call, check_run = _call(cand, case)
            checks[cand.name] = _check(cand, case, check_run, trials)
            if checks[cand.name][0]:
                calls[cand.name] = (call, (lambda b=cand.peer: bench.sdpa_backend(b)) if cand.peer else None)
        times = bench.time_interleaved(calls, **stop) if calls else {}
        rows.append({"case": case, "checks": checks, "times": times})
        print(f"{case.name}: " + ", ".join(f"{n} {t.median_ms:.4f} ms" if isinstance(t, bench.Timing) else f"{n} {t}"
                                         for n, t in times.items()), flush=True)
        torch.cuda.empty_cache()
    return rows


def _ratio(row: dict, a: Candidate, b: Candidate):
    ta, tb = row["times"].get(a.name), row["times"].get(b.name)
    return (tb.median_ms / ta.median_ms, ta, tb) if hasattr(ta, "median_ms") and hasattr(tb, "median_ms") else None


def table(a: Candidate, b: Candidate, rows: list[dict]) -> Table:
    out = []
    for row in rows:
        ratio = _ratio(row, a, b)
        verdicts = [("PASS" if c[0] else "FAIL") if isinstance(c, tuple) else c
                    for c in map(row["checks"].get, (a.name, b.name))]
        times = [t.median_ms if hasattr(t, "median_ms") else t for t in map(row["times"].get, (a.name, b.name))]
        out.append([row["case"].name, *verdicts, *times, ratio[0] if ratio else None])
    return Table(["case", f"A {a.name}", f"B {b.name}", "A ms", "B ms", "B / A time"], out,
                 "B / A below 1: B is faster")


def outcome(a: Candidate, b: Candidate, rows: list[dict]) -> str:
    """positive: B faster than A on every case beyond the spread (B's q3 below A's q1); negative: B failed a check, or
    was never faster; mixed: faster on some cases only; inconclusive: the spreads overlap everywhere, or nothing ran."""
    failed = any(isinstance(r["checks"].get(b.name), tuple) and not r["checks"][b.name][0] for r in rows)
    ratios = [x for x in (_ratio(r, a, b) for r in rows) if x]
    if failed:
        return "negative"
    faster = [tb.q3_ms < ta.q1_ms for _, ta, tb in ratios]
    slower = [tb.q1_ms > ta.q3_ms for _, ta, tb in ratios]
    if not ratios or not any(faster) and not any(slower):
        return "inconclusive"
    return "positive" if all(faster) else "mixed" if any(faster) else "negative"


def measurement(a: Candidate, b: Candidate, rows: list[dict]) -> dict:
    cells = [experiments.cell(f"{r['case'].name} · {name}", t) for r in rows for name, t in r["times"].items()
             if hasattr(t, "median_ms")]
    ratios = [(r["case"].name, x[0]) for r in rows if (x := _ratio(r, a, b))]
    failed = [f"{n} on {r['case'].name}" for r in rows for n, c in r["checks"].items()
              if isinstance(c, tuple) and not c[0]]
    summary = ("B / A time (below 1: B faster): " + ", ".join(f"{n} {x:.3f}" for n, x in ratios) if ratios
               else "no case was timed with both") + (f"; failed the check: {', '.join(failed)}" if failed else "")
    return {"metric": METRIC, "unit": "ms", "cells": cells, "summary": summary}


def new_record(experiment_id: str, a: Candidate, b: Candidate, rows: list[dict], *, hypothesis: str,
               prediction: str, decision: str = "", title: str = "", evidence=(), notebook: str = "",
               notes: str = "") -> dict:
    """The experiment's record, with GPU and commit from this process; a decision not given is the outcome's."""
    result, day = outcome(a, b, rows), experiment_id[:8]  # the date is the id's: the day the experiment began
    proposed = {"positive": f"adopt {b.name}", "negative": f"keep {a.name}", "mixed": f"{b.name} only where it wins",
                "inconclusive": f"keep {a.name}: no difference beyond the spread"}[result]
    entry = {"id": experiment_id, "title": title or f"{a.family}: {b.name} against {a.name}", "family": a.family,
             "date": f"{day[:4]}-{day[4:6]}-{day[6:8]}", "gpu": record.fingerprint()["gpu"],
             "commit": record.git_commit(), "hypothesis": hypothesis, "prediction": prediction,
             "measurement": measurement(a, b, rows), "decision": decision or f"{proposed} (proposed by the rule "
             f"in lab.ab.outcome)", "outcome": result, "evidence": list(evidence)}
    entry.update({k: v for k, v in (("notebook", notebook), ("notes", notes)) if v})
    return entry
