"""The log generators and the book's chapter copies, on fixture records (tests/fixture_outputs.py)."""
import hashlib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nbformat
import pytest

import fixture_outputs
from fixture_outputs import SESSIONS
from lab.publish import chapters as publish, log

# pytest-xdist (make test): the module's tests stay on one worker, so the fixture outputs and their log are made once, by the module fixture
pytestmark = pytest.mark.xdist_group("test_log")

OLD, NEW, CPU = (SESSIONS[k][0] for k in ("old", "new", "cpu"))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = fixture_outputs.build(tmp_path_factory.mktemp("fixture") / "outputs")
    log.generate(root)
    return root


def page(outputs, name):
    return (outputs / "log" / f"{name}.md").read_text()


def book(outputs, chapter):
    return nbformat.read(outputs / "book" / f"{chapter}.ipynb", as_version=4)


def test_every_page_starts_with_a_title(outputs):
    for name in ("sessions", "baselines", "bugs", "patterns"):
        assert page(outputs, name).splitlines()[0] == f"# {name.capitalize()}"


def test_gpu_copy_is_preferred_over_a_newer_cpu_copy(outputs):
    nb = book(outputs, "n4_baseline")
    assert nb.cells[0].source == "# Chapter n4_baseline"
    provenance = nb.cells[1].source
    assert provenance.startswith("Executed in session") and NEW in provenance and CPU not in provenance
    assert "NVIDIA H100 80GB HBM3" in provenance and "bbbb222222" in provenance and "2025-11-10" in provenance
    assert "CPU-mode" not in provenance and "v01 passes every seed case" in provenance
    assert nb.cells[2].source == "Run new of n4_baseline."


def test_cpu_only_chapter_is_published_with_a_warning(outputs):
    provenance = book(outputs, "n0_environment").cells[1].source
    assert CPU in provenance and "no GPU (CPU mode)" in provenance and "{warning}" in provenance


def test_failed_gpu_run_and_never_run_chapters(outputs):
    assert "This execution failed" in book(outputs, "n7_split_k").cells[1].source
    placeholder = book(outputs, "n3_harness")
    assert placeholder.cells[0].source.startswith("# ") and "not been executed" in placeholder.cells[1].source


def test_injected_parameters_are_hidden(outputs):
    injected = [c for c in book(outputs, "n4_baseline").cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "remove-cell" in injected[0].metadata["tags"]


def test_choose_tiers():
    def s(sid, mode, status, start):
        return {"id": sid, "mode": mode, "start": start, "_dir": Path("/nonexistent"),
                "chapters": [{"name": "c", "status": status}]}
    assert publish.choose("c", [s("a", "gpu", "ok", "1")]) is None  # no notebook file: nothing to publish


def test_baselines_pivot_figures_and_origin_rows(outputs):
    text = page(outputs, "baselines")
    assert "## NVIDIA H100 80GB HBM3" in text and '<table class="pivot"' in text
    fwd = text.split("### Forward: lab.ops.attention")[1].split("###")[0]
    assert "<th>vs sdpa-flash</th><th>vs sdpa-cudnn</th>" in re.sub(r' style="[^"]*"', "", fwd) and NEW in fwd
    rows = [re.sub(r' style="[^"]*"', "", line) for line in fwd.splitlines() if line.startswith("<tr><td")]
    assert [r.split("</td>")[2] for r in rows] == ["<td>1024", "<td>4096", "<td>8192"]  # sorted by S
    coloured = [line for line in fwd.splitlines() if line.startswith("<tr><td")]
    assert "background:rgba(46,160,67" in coloured[2] and ">1.25</td>" in coloured[2]  # faster: green
    assert "background:rgba(215,58,73" in coloured[0] and ">0.80</td>" in coloured[0]  # slower: red
    decode = re.sub(r' style="[^"]*"', "", text.split("### Decode: lab.ops.decode")[1].split("###")[0])
    assert "<th>L (kv)</th>" in decode and "<td>32/8</td>" in decode
    for family in ("fwd", "decode"):
        assert f"![" in text and f"figures/pivot-{family}-h100-80gb-hbm3.png" in text
        assert (outputs / "log" / "figures" / f"pivot-{family}-h100-80gb-hbm3.png").stat().st_size > 1000
    assert "![Ratio trend on NVIDIA H100 80GB HBM3](figures/trend-h100-80gb-hbm3.png)" in text
    assert (outputs / "log" / "figures" / "trend-h100-80gb-hbm3.png").stat().st_size > 1000
    assert "| Medium | 128 | 0.044 | 0.743 | 0.06x | seeds/000, Session N+2, 2025-10-12 |" in text
    assert "79.8% less memory" in text and (outputs / "log" / "figures" / "origin-l4.png").exists()


def test_standings_show_every_family_against_its_yardstick(outputs):
    text = (outputs / "log" / "standings.md").read_text()
    assert "### NVIDIA H100 80GB HBM3" in text and "cpu" not in text.lower().split("### ")[1]
    lines = [l for l in text.splitlines() if l.startswith("| ") and not l.startswith("| Family")]
    families = {l.split(" | ")[0][2:]: l for l in lines}
    assert set(families) == {"forward", "backward", "decode", "paged decode", "ring"}
    assert families["forward"].startswith("| forward | lab.ops.attention | 1.00x |")  # geometric mean of 0.8, 1.0, 1.25
    assert "| 0.50x |" in families["backward"] and "| 0.90x |" in families["paged decode"]
    assert "| lab.ops.decode |" in families["decode"]
    details = {l.split("**")[1]: l for l in text.splitlines() if l.startswith("- **")}
    assert NEW in details["forward"] and "range (cells) flash 0.80-1.25 (3)" in details["forward"]
    ring = details["ring"]
    assert "no SDPA yardstick timed in this session" in ring and "2.00x lab.ops.attention on one GPU" in ring


def test_standings_fit_the_text_column_and_name_real_modules(outputs):
    """The front page's tables fit the book's text column (about 700 px: no scrollbar): at most seven columns and
    70 characters of cell text per row; every kernel they name is a module attribute users can import."""
    import importlib

    text = (outputs / "log" / "standings.md").read_text()
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in text.splitlines() if l.startswith("| ")]
    assert rows and all(len(r) <= 7 for r in rows), max(rows, key=len)
    assert all(sum(len(c) for c in r) <= 70 for r in rows), max(rows, key=lambda r: sum(map(len, r)))
    kernels = {r[1] for r in rows if r[0] != "Family"}
    assert "lab.ring.ring_attention" in kernels and not any("lab.dist" in k for k in kernels)
    for name in kernels:
        module, _, attribute = name.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attribute)), name


def test_legacy_impl_names_stand_in_for_the_public_op():
    from lab.publish import pivot

    def row(impl, session, stamp, S=1024):
        return {"kind": "fwd", "impl": impl, "session": session, "timestamp": stamp, "env": {"gpu": "G"},
                "case": {"Sq": S, "Sk": S, "D": 64}, "timing": {"median_ms": 1.0}, "ratios": {"sdpa-flash": 1.0}}
    old = [row("v03", "s1", "1"), row("v04", "s1", "2"), row("v04", "s1", "3", S=2048), row("sdpa-flash", "s1", "4")]
    assert pivot.ours(old, "fwd")[:2] == ("v04", "s1") and len(pivot.ours(old, "fwd")[2]) == 2
    new = old + [row("lab.ops.attention", "s2", "5"), row("v05", "s2", "6")]
    assert pivot.ours(new, "fwd")[:2] == ("lab.ops.attention", "s2")
    trying_v06 = new + [row("v06", "s3", "7")]  # a newer session that timed only a new version
    assert pivot.ours(trying_v06, "fwd")[:2] == ("lab.ops.attention", "s2")
    decode = [{**row("auto", "s1", "1"), "kind": "decode"}, {**row("v02", "s1", "2"), "kind": "decode"}]
    assert pivot.ours(decode, "decode")[0] == "auto"
    assert pivot.ours([{**r, "env": {"gpu": "cpu"}} for r in old], "fwd") == (None, None, [])


def test_bugs_merge_curated_records_and_failures(outputs):
    text = page(outputs, "bugs")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "historical" in rows["BUG-L4-1"] and "historical" in rows["BUG-L4-2"]
    assert "fixed" in rows["BUG-001"] and "`aaaa111111` v01" in rows["BUG-001"]
    assert "open" in rows["RUN-n7_split_k-RuntimeError"] and "open" in rows["CHECK-v02-odd"]
    assert not any("LAB_BUG_LAYOUT" in key for key in rows)  # a deliberate failure is not a bug
    assert "| Reproducing shape | odd: B2 H16/16 S65 D64 bf16 |" in text
    assert f"../sessions/{OLD}/figures/layout.png" in text
    assert f"<session-{OLD}>" in text.split("## BUG-001")[1].split("##")[0]
    assert text.index("## CHECK-v02-odd") < text.index("## BUG-001") < text.index("## BUG-L4-1")


def test_a_self_test_cases_failures_open_no_bug():
    """The backward chapter's self-test rows (case `bwd-selftest`, builds without Delta that must fail) are failures
    on purpose; an ordinary failing check of the same kernel still opens one."""
    from lab.publish import ledger

    def row(impl, case):
        return {"kind": "check", "impl": impl, "chapter": "n10_backward", "session": "s1", "timestamp": "1",
                "env": {"gpu": "G"}, "case": {"name": case, "B": 1, "Hq": 4, "Hkv": 4, "Sq": 130, "Sk": 130, "D": 64},
                "check": {"passed": False, "max_abs": 21.9}}
    ids = {b["id"] for b in ledger.bugs(Path("/nonexistent"), [row("no-delta-bwd-v01:dq", "bwd-selftest"),
                                                               row("bwd-no-delta:dk", "bwd-selftest"),
                                                               row("bwd-v14", "odd")])}
    assert ids == {"CHECK-bwd-v14-odd"}, ids


def test_patterns_resolve_evidence_or_say_there_is_none(outputs):
    text = page(outputs, "patterns")
    for n in range(1, 12):
        assert f"## P{n}. " in text
    assert "## L2. Lease budget" in text and "## L4. Ratios, not absolute times" in text
    p8 = text.split("## P8. ")[1].split("## P9.")[0]
    assert "| cold build (<= 60) | 1 | 21.50 | supports |" in p8
    assert "| edit, rebuild and load (<= 10) | 1 | 3.20 | supports |" in p8
    p9 = text.split("## P9. ")[1].split("## P10.")[0]
    assert "no evidence yet" in p9
    p7 = text.split("## P7. ")[1].split("## P8.")[0]
    assert "| 2 | 300 (all 2) | supports |" in p7  # two GPU sessions of 300 s, both within the lease


def test_sessions_index(outputs):
    text = page(outputs, "sessions")
    index = text.split("(session-")[0]
    assert index.index(CPU) < index.index(NEW) < index.index(OLD)  # newest first
    assert "$0.17 (0.08 h at $2.00)" in index and "3 ok, 1 failed" in index and "| complete |" in index
    assert f"({'session-' + NEW})=\n## {NEW}" in text and "RuntimeError: no kernel image is available" in text


def test_generation_is_repeatable_and_never_touches_sessions(outputs):
    def digest(folder):
        return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}
    sessions, pages_before = digest(outputs / "sessions"), digest(outputs / "log")
    log.generate(outputs)
    assert digest(outputs / "sessions") == sessions
    assert {p: d for p, d in digest(outputs / "log").items() if p.suffix == ".md"} == \
           {p: d for p, d in pages_before.items() if p.suffix == ".md"}


# ---------------------------------------------------------------- untrusted session folders

def _copy_fixture(tmp_path) -> Path:
    return fixture_outputs.build(tmp_path / "outputs")


def _session_json(outputs, which):
    return outputs / "sessions" / SESSIONS[which][0] / "session.json"


def test_crafted_session_json_cannot_read_or_write_outside(tmp_path):
    outputs = _copy_fixture(tmp_path)
    secret = tmp_path / "secret.ipynb"
    nbformat.write(fixture_outputs.notebook("SECRET", "not for publishing"), secret)
    path = _session_json(outputs, "new")
    info = __import__("json").loads(path.read_text())
    info["id"] = "../../../escape"
    info["chapters"] += [
        {"name": "../../../../pwned", "status": "ok", "notebook": "n4_baseline.ipynb"},
        {"name": "n3_harness", "status": "ok", "notebook": str(secret)},
        {"name": "n0_environment", "status": "ok", "notebook": "../../../secret.ipynb"},
    ]
    path.write_text(__import__("json").dumps(info))
    (outputs / "sessions" / SESSIONS["new"][0] / "link.ipynb").symlink_to(secret)
    info["chapters"].append({"name": "n5_correctness", "status": "ok", "notebook": "link.ipynb"})
    path.write_text(__import__("json").dumps(info))
    before = sorted(p for p in tmp_path.rglob("*") if "outputs" not in p.relative_to(tmp_path).parts[:1])
    with pytest.warns(Warning) as caught:
        log.generate(outputs)
    messages = " ".join(str(w.message) for w in caught)
    assert "not in _toc.yml" in messages and "is not a file name in the session folder" in messages
    assert "points outside its session folder" in messages
    after = sorted(p for p in tmp_path.rglob("*") if "outputs" not in p.relative_to(tmp_path).parts[:1])
    assert after == before  # nothing written outside outputs/
    assert not list(tmp_path.rglob("pwned*"))
    for chapter in ("n3_harness", "n0_environment", "n5_correctness"):
        text = (outputs / "book" / f"{chapter}.ipynb").read_text()
        assert "SECRET" not in text and "not for publishing" not in text
    assert "escape" not in page(outputs, "sessions")  # a session's id is its folder's name


def test_untrusted_text_is_escaped_in_pages(tmp_path):
    import json

    outputs = _copy_fixture(tmp_path)
    path = _session_json(outputs, "new")
    info = json.loads(path.read_text())
    failed = next(c for c in info["chapters"] if c["status"] == "failed")
    failed["error"] = "<script>alert(1)</script> {ref}`x <y>` [link](http://evil) | pipe"
    failed["traceback"] = "Traceback:\n```\n<b>bold</b>\n````python\nboom"
    path.write_text(json.dumps(info))
    records = outputs / "sessions" / SESSIONS["new"][0] / "records.jsonl"
    with open(records, "a") as handle:
        handle.write(json.dumps({"kind": "bug", "id": "BUG-<img src=x onerror=alert(1)>", "title": "```\n# not a heading",
                                 "status": "open", "session": SESSIONS["new"][0], "timestamp": "2025-11-10T10:00:00+00:00",
                                 "env": fixture_outputs.H100, "figures": ["../../../../etc/passwd", "/etc/hostname"]}) + "\n")
    log.generate(outputs)
    sessions = page(outputs, "sessions")
    assert "<script>" not in sessions and "&lt;script&gt;" in sessions
    assert "\\{ref\\}" in sessions and "\\[link\\](http://evil)" in sessions and "\\| pipe" in sessions
    fence = sessions.split("Traceback of n7\\_split\\_k" if "n7\\_split\\_k" in sessions else "Traceback of n7_split_k")[1]
    assert fence.split("\n")[2].startswith("`````text")  # longer than any backtick run inside
    body = fence.split("`````text\n")[1].split("\n`````")[0]
    assert "```\n<b>bold</b>\n````python" in body  # shown verbatim inside the fence
    bugs = page(outputs, "bugs")
    assert "<img" not in bugs and "&lt;img src=x onerror=alert(1)&gt;" in bugs
    assert "\n# not a heading" not in bugs and "etc/passwd" not in bugs and "hostname" not in bugs


def test_truncated_notebook_and_session_json_are_skipped_with_a_warning(tmp_path):
    outputs = _copy_fixture(tmp_path)
    new_n4 = outputs / "sessions" / SESSIONS["new"][0] / "n4_baseline.ipynb"
    new_n4.write_bytes(new_n4.read_bytes()[:200])  # a full disk cut it short
    torn = _session_json(outputs, "old")
    torn.write_text(torn.read_text()[:100])
    with pytest.warns(Warning) as caught:
        written = log.generate(outputs)
    messages = " ".join(str(w.message) for w in caught)
    assert f"{new_n4}: unreadable notebook skipped" in messages and f"{torn}: unreadable session.json" in messages
    assert written["chapters"]["n4_baseline"] == CPU  # the next candidate: the CPU copy, with its warning
    assert SESSIONS["old"][0] not in page(outputs, "sessions").split("(session-")[0]


def test_running_session_is_abandoned_when_its_heartbeat_is_stale(tmp_path):
    import datetime as dt
    import json

    from lab.publish import pages

    outputs = _copy_fixture(tmp_path)
    path = _session_json(outputs, "cpu")
    info = json.loads(path.read_text())
    info.update(status="running", pid=1, host="another-host")
    path.write_text(json.dumps(info))
    beat = path.parent / "heartbeat"
    now = dt.datetime.now(dt.timezone.utc)
    beat.write_text((now - dt.timedelta(seconds=30)).isoformat())
    assert pages.load_sessions(outputs)[-1]["status"] == "running"  # beating: still at work elsewhere
    beat.write_text((now - dt.timedelta(seconds=pages.STALE_S + 60)).isoformat())
    assert pages.load_sessions(outputs)[-1]["status"] == "abandoned"


def test_void_gates_are_counted_and_shown(tmp_path):
    import json

    outputs = _copy_fixture(tmp_path)
    path = _session_json(outputs, "new")
    info = json.loads(path.read_text())
    info["gates"] = {"pass": 1, "fail": 0, "no data": 0, "void": 2}
    info.update(status="failed", error="OutputError: cannot write /x/session.json: the disk is full",
                traceback="Traceback (most recent call last):\nOutputError: the disk is full")
    path.write_text(json.dumps(info))
    log.generate(outputs)
    text = page(outputs, "sessions")
    assert "1 / 0 / 0 (2 void)" in text and "status failed" in text
    assert "The runner stopped on an error: OutputError: cannot write /x/session.json: the disk is full" in text
    assert "Traceback of the runner (shortened):\n\n````text\nTraceback (most recent call last)" in text


def test_latest_summary_names_failed_chapters(outputs):
    assert log.latest_summary(outputs) == f"latest session {CPU}: complete; no chapter failed"
    import shutil
    copy = outputs.parent / "summary"
    shutil.copytree(outputs, copy)
    shutil.rmtree(copy / "sessions" / CPU)
    assert log.latest_summary(copy) == f"latest session {NEW}: complete; failed chapters: n7_split_k"


def test_log_cli_reports_an_unwritable_log_folder(tmp_path, monkeypatch, capsys):
    import errno

    from lab import files

    outputs = _copy_fixture(tmp_path)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    assert log.main(["--outputs", str(outputs)]) == 1
    err = capsys.readouterr().err
    assert f"log generation failed: cannot write {outputs / 'log' / 'sessions.md'}: the file system is read-only" in err
    assert not list((outputs / "log").glob("*.md")) if (outputs / "log").exists() else True


def test_a_newer_head_dim_session_does_not_stand_for_the_family():
    """Chapter n14 times lab.ops.attention on lab.cases' head-dim sets (hd-, hdw-): a session of those alone must
    not replace the family's headline shapes on the front page and the baselines page."""
    from lab.publish import pivot

    def row(session, stamp, name, D):
        case = {"name": name, "B": 8, "Hq": 16, "Hkv": 16, "Sq": 2048, "Sk": 2048, "D": D, "dtype": "bfloat16",
                "causal": False}
        return {"kind": "bwd", "session": session, "timestamp": stamp, "impl": "lab.ops.attention", "case": case,
                "timing": {"median_ms": 1.0}, "ratios": {"sdpa-cudnn": 1.0}, "env": {"gpu": "NVIDIA H100"}}

    rows = [row("headline", "2026-01-01T00:00:00", "bwd-d128-s2048", 128),
            row("head-dims", "2026-01-02T00:00:00", "hdw-d256-s2048", 256),
            row("head-dims", "2026-01-02T00:00:01", "hd-d80-s2048", 80)]
    impl, session, chosen = pivot.ours(rows, "bwd")
    assert (impl, session) == ("lab.ops.attention", "headline") and len(chosen) == 1
    assert pivot.ours(rows[1:], "bwd") == (None, None, [])
