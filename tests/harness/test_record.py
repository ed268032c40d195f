"""lab/record.py: append-only JSON-lines records, common fields, filters, GPU-session selection."""
from __future__ import annotations

import datetime as dt
import gzip
import json
import types
from pathlib import Path

import numpy as np
import pytest

from lab import paths, record

H100 = {"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sms": 132, "driver": "580.1", "cuda": "13.0",
        "torch": "2.13.0", "nvcc": "13.0", "python": "3.11.2", "host": "gpu-box"}
CPU = {**H100, "gpu": "cpu", "capability": None, "sms": None, "driver": None, "cuda": None}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A cache of this test's own: the markers of records files found clean (records-clean/) are shared between
    processes through LAB_CACHE_DIR, and a test that counts reads must start without any."""
    monkeypatch.setattr(paths, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(record, "_clean_files", set())
    monkeypatch.setattr(record, "_token_lines", {})
    return tmp_path / "cache"


def test_run_dir_honours_lab_session_dir(session_dir):
    assert record.run_dir() == session_dir
    assert session_dir.is_dir()
    assert record.run_id() == "session-under-test"
    assert record.figure_path("x.png") == session_dir / "figures" / "x.png"
    assert (session_dir / "figures").is_dir()


def test_run_dir_without_a_session_is_one_adhoc_folder_per_process(session_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("LAB_SESSION_DIR")
    monkeypatch.setattr(paths, "OUTPUTS", tmp_path / "outputs")
    folder = record.run_dir()
    assert folder.parent == tmp_path / "outputs" / "adhoc" and folder.is_dir()
    assert record.run_dir() == folder  # cached: every row of this run goes to the same file
    assert folder.name.endswith("-" + record.git_commit())
    assert "-" + record.slug(record.fingerprint()["gpu"]) + "-" in folder.name


def test_slug_and_run_id_format(session_dir, monkeypatch):
    assert record.slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert record.slug("  NVIDIA GeForce RTX 4090 ") == "geforce-rtx-4090"
    assert record.slug("cpu") == "cpu"
    assert record.slug("???") == "unknown"
    monkeypatch.setattr(record, "fingerprint", lambda: H100)
    monkeypatch.setattr(record, "git_commit", lambda: "abc1234567")
    when = dt.datetime(2025, 10, 12, 8, 30, 5, tzinfo=dt.timezone.utc)
    assert record.new_run_id(when) == "20251012-083005-h100-80gb-hbm3-abc1234567"


def test_append_and_load_round_trip(session_dir, monkeypatch):
    monkeypatch.setenv("LAB_CHAPTER", "03-v01")
    written = record.append({"kind": "fwd", "impl": "v01", "case": {"name": "c1", "D": 64, "causal": False},
                             "timing": {"median_ms": 1.5}, "value": np.float32(2.5), "where": Path("/x/y")})
    assert written["value"] == np.float32(2.5)
    rows = record.load(session_dir)
    assert len(rows) == 1
    row = rows[0]
    for key in ("kind", "chapter", "session", "timestamp", "commit", "env"):
        assert key in row, key
    assert row["kind"] == "fwd" and row["chapter"] == "03-v01" and row["session"] == "session-under-test"
    assert row["commit"] == record.git_commit() and row["commit"]
    assert row["env"]["gpu"] == record.fingerprint()["gpu"] and "torch" in row["env"] and "nvcc" in row["env"]
    stamp = dt.datetime.fromisoformat(row["timestamp"])
    assert stamp.tzinfo is not None and abs((dt.datetime.now(dt.timezone.utc) - stamp).total_seconds()) < 60
    assert row["impl"] == "v01" and row["case"] == {"name": "c1", "D": 64, "causal": False}
    assert row["value"] == 2.5 and row["where"] == "/x/y"  # numpy scalars and paths become JSON
    assert row["timing"] == {"median_ms": 1.5}


def test_append_defaults_kind_and_chapter_argument(session_dir):
    row = record.append({"x": 1}, chapter="01-intro")
    assert row["kind"] == "measurement" and row["chapter"] == "01-intro"
    assert record.load(session_dir)[0]["chapter"] == "01-intro"


def test_appends_never_rewrite(session_dir):
    record.append({"kind": "a", "n": 1})
    path = session_dir / "records.jsonl"
    before = path.read_bytes()
    assert before.endswith(b"\n") and before.count(b"\n") == 1
    record.append({"kind": "b", "n": 2})
    after = path.read_bytes()
    assert after.startswith(before)  # the first line is byte-for-byte unchanged
    lines = _lines(path)
    assert len(lines) == 2 and json.loads(lines[1])["n"] == 2
    # a line already in the file (e.g. from an earlier process) is kept as is
    path.write_text(lines[0] + "\n" + '{"kind": "foreign", "env": {"gpu": "cpu"}}\n' + lines[1] + "\n")
    snapshot = path.read_text()
    record.append({"kind": "c"})
    assert path.read_text().startswith(snapshot)
    assert [r["kind"] for r in record.load(session_dir)] == ["a", "foreign", "b", "c"]


def _write_session(root: Path, name: str, env: dict, rows: list[dict], monkeypatch):
    """Append rows through record.append as a session named `name` measured on `env`."""
    monkeypatch.setenv("LAB_SESSION_DIR", str(root / name))
    monkeypatch.setattr(record, "fingerprint", lambda: env)
    return [record.append(r) for r in rows]


def test_load_filters_on_top_level_and_case_fields(session_dir, tmp_path, monkeypatch):
    root = tmp_path / "outputs"
    _write_session(root, "s1", H100, [
        {"kind": "fwd", "impl": "v01", "case": {"name": "a", "D": 64, "causal": True}},
        {"kind": "fwd", "impl": "v02", "case": {"name": "b", "D": 128, "causal": True}},
        {"kind": "decode", "impl": "v01", "case": {"name": "c", "D": 128, "causal": False}},
        {"kind": "check", "impl": "v02"},  # no case at all
    ], monkeypatch)
    assert len(record.load(root)) == 4
    assert [r["case"]["name"] for r in record.load(root, kind="fwd")] == ["a", "b"]
    assert [r["kind"] for r in record.load(root, impl="v02")] == ["fwd", "check"]
    assert [r["case"]["name"] for r in record.load(root, D=128)] == ["b", "c"]  # a case field
    assert [r["case"]["name"] for r in record.load(root, kind="fwd", causal=True, impl="v02")] == ["b"]
    assert [r["case"]["name"] for r in record.load(root, causal=False)] == ["c"]
    assert record.load(root, kind="sweep") == []
    assert record.load(tmp_path / "nothing-here") == []


def test_load_gpu_only_drops_cpu_rows(session_dir, tmp_path, monkeypatch):
    root = tmp_path / "outputs"
    _write_session(root, "gpu-session", H100, [{"kind": "fwd", "impl": "v02"}], monkeypatch)
    _write_session(root, "cpu-session", CPU, [{"kind": "fwd", "impl": "v02"}, {"kind": "check"}], monkeypatch)
    everything = record.load(root)
    assert len(everything) == 3
    gpu = record.load(root, gpu_only=True)
    assert [r["session"] for r in gpu] == ["gpu-session"]
    assert [r["session"] for r in record.load(root, gpu_only=True, kind="check")] == []
    assert len(record.load(root, kind="fwd")) == 2


def _row(session, gpu, timestamp, **extra):
    return {"session": session, "timestamp": timestamp, "env": {"gpu": gpu}, **extra}


def test_latest_gpu_rows_picks_the_latest_gpu_session_and_ignores_cpu():
    rows = [
        _row("old-h100", "NVIDIA H100", "2025-10-01T10:00:00+00:00", n=1),
        _row("new-a100", "NVIDIA A100", "2025-10-03T10:00:00+00:00", n=2),
        _row("old-h100", "NVIDIA H100", "2025-10-01T10:05:00+00:00", n=3),
        _row("cpu-run", "cpu", "2025-10-09T10:00:00+00:00", n=4),  # newest, but measured without a GPU
        _row("new-a100", "NVIDIA A100", "2025-10-03T10:01:00+00:00", n=5),
        {"session": "no-env", "timestamp": "2025-10-10T00:00:00+00:00", "n": 6},  # no env: treated as CPU
    ]
    assert [r["n"] for r in record.latest_gpu_rows(rows)] == [2, 5]
    assert record.latest_gpu_rows([r for r in rows if r.get("env", {}).get("gpu", "cpu") == "cpu"]) == []
    assert record.latest_gpu_rows([]) == []


def _clock(monkeypatch, when: str):
    """Make record.append stamp rows with `when` (UTC)."""
    fixed = dt.datetime.fromisoformat(when)

    class Fixed(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    monkeypatch.setattr(record, "dt", types.SimpleNamespace(datetime=Fixed, timezone=dt.timezone))


def test_latest_gpu_rows_through_load(session_dir, tmp_path, monkeypatch):
    root = tmp_path / "outputs"
    _clock(monkeypatch, "2025-10-02T00:00:00+00:00")
    _write_session(root, "b-older", H100, [{"kind": "fwd", "n": 1}, {"kind": "fwd", "n": 2}], monkeypatch)
    _clock(monkeypatch, "2025-10-05T00:00:00+00:00")
    _write_session(root, "a-newer", {**H100, "gpu": "NVIDIA A100-SXM4-80GB"}, [{"kind": "fwd", "n": 3}], monkeypatch)
    _clock(monkeypatch, "2025-10-09T00:00:00+00:00")
    _write_session(root, "c-cpu", CPU, [{"kind": "fwd", "n": 4}], monkeypatch)
    rows = record.load(root)
    assert len(rows) == 4 and rows[0]["timestamp"] == "2025-10-05T00:00:00+00:00"  # files load in path order
    latest = record.latest_gpu_rows(rows)
    assert [r["n"] for r in latest] == [3] and latest[0]["session"] == "a-newer"


@pytest.mark.parametrize("value, expected", [(np.int64(3), 3), (np.float64(0.5), 0.5), (Path("a/b"), "a/b")])
def test_jsonable(value, expected):
    assert record._jsonable(value) == expected


def test_one_reader_skips_torn_lines_with_file_and_line(tmp_path):
    folder = tmp_path / "outputs" / "sessions" / "s1"
    folder.mkdir(parents=True)
    path = folder / "records.jsonl"
    path.write_text('{"kind": "fwd", "n": 1}\n{"kind": "fwd", "n": 2, "ca\n[1, 2]\n\n{"kind": "fwd", "n": 3}\n{"kind"')
    with pytest.warns(record.TornLineWarning) as caught:
        rows = record.load(tmp_path / "outputs", kind="fwd")
    assert [r["n"] for r in rows] == [1, 3]
    messages = [str(w.message) for w in caught]
    assert any(f"{path}:2: skipped a torn record line: not JSON" in m for m in messages)
    assert any(f"{path}:3: skipped a torn record line: not a JSON object" in m for m in messages)
    assert any(f"{path}:6:" in m for m in messages)
    invalid = folder / "binary" / "records.jsonl"
    invalid.parent.mkdir()
    invalid.write_bytes(b'{"kind": "fwd", "n": 4}\n\xff\xfe{"kind"\n')
    with pytest.warns(record.TornLineWarning, match=r"binary/records.jsonl:2"):
        assert [r["n"] for r in record.read(invalid)] == [4]
    assert record.read(tmp_path / "nowhere" / "records.jsonl") == []


def test_runner_rows_use_the_same_writer(tmp_path):
    folder = tmp_path / "20250101-000000-cpu-abc"
    row = record.append({"kind": "gate", "chapter": "n4_baseline", "name": "g"}, chapter="n4_baseline",
                        folder=folder, env={"gpu": "cpu"})
    assert row["session"] == folder.name and row["env"] == {"gpu": "cpu"} and row["chapter"] == "n4_baseline"
    assert record.read(folder / "records.jsonl") == [row]


def test_one_session_id_format(monkeypatch):
    monkeypatch.setattr(record, "git_commit", lambda: "abc1234567")
    when = dt.datetime(2025, 11, 1, 10, 0, 0, tzinfo=dt.timezone.utc)
    assert record.session_id("NVIDIA H200", when) == "20251101-100000-h200-abc1234567"
    monkeypatch.setattr(record, "fingerprint", lambda: {"gpu": "cpu"})
    assert record.new_run_id(when) == "20251101-100000-cpu-abc1234567"


# ------------------------------------------------------------------ gzipped records (records.jsonl.gz)

def _plain(folder: Path, rows: list[dict], tail: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / record.RECORDS
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def test_gzipped_records_read_and_load_like_plain(tmp_path):
    root = tmp_path / "outputs"
    rows = [{"kind": "fwd", "n": i, "case": {"B": i}} for i in range(5)]
    plain = _plain(root / "sessions" / "a", rows)
    _plain(root / "sessions" / "b", rows)
    assert record.compress(root / "sessions" / "b") is not None
    packed = root / "sessions" / "b" / record.RECORDS_GZ
    assert not (root / "sessions" / "b" / record.RECORDS).exists()
    assert record.read(packed) == record.read(plain) == rows
    assert record.session_rows(packed.parent) == rows
    assert record.load(root) == rows + rows  # a first, then b: the folders' order, whatever the file form
    assert record.load(root, B=3) == [rows[3], rows[3]]
    assert record.folders(root) == [root / "sessions" / "a", root / "sessions" / "b"]


def test_compress_is_deterministic_and_keeps_every_byte(tmp_path):
    text = '{"kind": "fwd", "n": 1}\n{"kind": "fwd", "n": 2}\n'
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        (tmp_path / name / record.RECORDS).write_text(text)
        record.compress(tmp_path / name)
    x, y = ((tmp_path / n / record.RECORDS_GZ).read_bytes() for n in ("x", "y"))
    assert x == y and gzip.decompress(x).decode() == text
    assert record.compress(tmp_path / "x") is None, "nothing plain left to compress"


def test_rows_appended_after_compression_come_after_the_gzipped_ones(tmp_path):
    folder = tmp_path / "s"
    _plain(folder, [{"n": 1}], tail='{"n": 2, "torn')  # a killed writer left a torn last line
    record.compress(folder)
    record.append({"n": 3}, folder=folder, env={"gpu": "cpu"})
    with pytest.warns(record.TornLineWarning, match=r"records.jsonl.gz:2: skipped a torn record line"):
        assert [r["n"] for r in record.session_rows(folder)] == [1, 3]
    # compressing again joins both files; the torn line stays alone on its line and loses no row
    record.compress(folder)
    assert not (folder / record.RECORDS).exists()
    with pytest.warns(record.TornLineWarning):
        assert [r["n"] for r in record.session_rows(folder)] == [1, 3]


def test_a_folder_with_both_forms_never_reads_a_row_twice(tmp_path):
    rows = [{"n": 1}, {"n": 2}]
    restored = tmp_path / "restored"  # the original plain file brought back from git beside its .gz
    _plain(restored, rows)
    (restored / record.RECORDS_GZ).write_bytes(record.compressed(restored))
    record.append({"n": 3}, folder=restored, env={"gpu": "cpu"})
    assert [r["n"] for r in record.session_rows(restored)] == [1, 2, 3]
    stopped = tmp_path / "stopped"  # compress wrote the .gz of both files, then stopped before the unlink
    _plain(stopped, rows[:1])
    record.compress(stopped)
    _plain(stopped, rows[1:])
    (stopped / record.RECORDS_GZ).write_bytes(record.compressed(stopped))
    assert [r["n"] for r in record.session_rows(stopped)] == [1, 2]
    assert [r["n"] for r in record.load(tmp_path)] == [1, 2, 3, 1, 2]


def test_a_cut_gzip_file_gives_its_first_rows_with_a_warning(tmp_path):
    folder = tmp_path / "s"
    _plain(folder, [{"n": i, "pad": "x" * 50} for i in range(200)])
    record.compress(folder)
    packed = folder / record.RECORDS_GZ
    packed.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    with pytest.warns(record.TornLineWarning) as caught:  # the damage, then the torn line it cut
        rows = record.read(packed)
    assert "damaged gzip data" in str(caught[0].message)
    assert 0 < len(rows) < 200 and [r["n"] for r in rows] == list(range(len(rows)))


def test_a_second_load_of_an_archive_gives_what_a_fresh_read_gives(tmp_path):
    """load() parses an archive read whole before only where a line holds every plain string it matches on; the
    rows are the same as a fresh read's, for top-level and case fields, strings that JSON escapes, other types,
    and after the archive is compressed again with more rows."""
    root = tmp_path / "outputs"
    rows = [{"kind": "fwd", "chapter": "n10", "n": 0, "case": {"version": "v02", "B": 1}},
            {"kind": "bwd", "chapter": "n10", "n": 1, "case": {"version": "v02", "B": 2}},
            {"kind": "fwd", "chapter": "n9", "n": 2, "note": "v02", "case": {"version": "v03", "B": 1}},
            {"kind": "fwd", "chapter": "n10", "n": 3, "version": "v02", "name": "caf\u00e9 \"q\""},
            {"kind": "fwd", "chapter": "n10", "n": 4, "env": {"gpu": "cpu"}, "case": {"version": "v02"}}]
    _plain(root / "sessions" / "a", rows)
    record.compress(root / "sessions" / "a")
    queries = [{"kind": "fwd"}, {"chapter": "n10", "version": "v02"}, {"version": "v02", "B": 2}, {"B": 1},
               {"name": "caf\u00e9 \"q\""}, {"kind": "fwd", "gpu_only": True}, {"note": "v02"}, {}]
    for query in queries:
        record._clean_files.clear()
        fresh = record.load(root, **query)
        assert record.load(root, **query) == fresh and record.load(root, **query) == fresh, query
    assert [r["n"] for r in record.load(root, chapter="n10", version="v02")] == [0, 1, 3, 4]
    assert [r["n"] for r in record.load(root, name="caf\u00e9 \"q\"")] == [3]
    record.append({"kind": "fwd", "chapter": "n10", "n": 5, "case": {"version": "v02"}}, folder=root / "sessions" / "a",
                  env={"gpu": "cpu"})
    record.compress(root / "sessions" / "a")  # a new archive in place of the one read before
    assert [r["n"] for r in record.load(root, chapter="n10", version="v02")] == [0, 1, 3, 4, 5]


def test_loads_that_share_a_plain_string_read_the_archive_once_more_in_all(tmp_path, monkeypatch):
    """After the whole read, the lines holding a load's first plain string are kept: the next loads that match on it
    (a chapter's cells, each its own kind of rows) neither gunzip nor scan the archive, and give a fresh read's rows."""
    root = tmp_path / "outputs"
    rows = [{"kind": kind, "chapter": chapter, "n": n} for n, (kind, chapter) in
            enumerate([("fwd", "n10"), ("bwd", "n10"), ("fwd", "n9"), ("bwd", "n10"), ("fwd", "n10")])]
    _plain(root / "sessions" / "a", rows)
    record.compress(root / "sessions" / "a")
    fresh = {"fwd": [0, 4], "bwd": [1, 3]}
    assert [r["n"] for r in record.load(root, chapter="n10", kind="fwd")] == fresh["fwd"]  # the whole read
    reads = []
    raw = record._raw
    monkeypatch.setattr(record, "_raw", lambda file: reads.append(file) or raw(file))
    for _ in range(2):
        assert {kind: [r["n"] for r in record.load(root, chapter="n10", kind=kind)] for kind in ("fwd", "bwd")} == fresh
        assert [r["n"] for r in record.load(root, chapter="n10")] == [0, 1, 3, 4]
    assert len(reads) == 1, reads  # the first skim of "n10" read it; every later load used its lines
    assert [r["n"] for r in record.load(root, chapter="n9")] == [2] and len(reads) == 2


def test_a_clean_archive_is_parsed_whole_once_across_processes(tmp_path, own_cache, monkeypatch):
    """The first process that reads an archive whole without a torn line leaves a marker named by the hash of its
    bytes; a later process (here: the module's memory emptied) then parses only the lines that can match, and gets a
    fresh read's rows. Other bytes (the archive written again with one more row) have no marker: read whole again."""
    root = tmp_path / "outputs"
    rows = [{"kind": "fwd" if n % 3 else "bwd", "chapter": f"n{n % 4}", "n": n} for n in range(40)]
    _plain(root / "sessions" / "a", rows)
    record.compress(root / "sessions" / "a")
    want = [r["n"] for r in rows if r["chapter"] == "n1" and r["kind"] == "fwd"]
    parsed = []
    real = record.json.loads
    monkeypatch.setattr(record.json, "loads", lambda text, *a, **k: parsed.append(text) or real(text, *a, **k))
    assert [r["n"] for r in record.load(root, chapter="n1", kind="fwd")] == want
    assert len(parsed) == 40  # the first read: every row
    assert len(list((own_cache / "records-clean").iterdir())) == 1
    for _ in range(2):  # a new process: the marker is found, only the rows of n1 are parsed
        record._clean_files.clear()
        record._token_lines.clear()
        parsed.clear()
        assert [r["n"] for r in record.load(root, chapter="n1", kind="fwd")] == want
        assert len(parsed) == len(want) and all('"n1"' in line for line in parsed)  # the lines holding both strings
    record.append({"kind": "fwd", "chapter": "n1", "n": 40}, folder=root / "sessions" / "a", env={"gpu": "cpu"})
    record.compress(root / "sessions" / "a")
    record._clean_files.clear()
    parsed.clear()
    assert [r["n"] for r in record.load(root, chapter="n1", kind="fwd")] == want + [40]
    assert len(parsed) == 41 and len(list((own_cache / "records-clean").iterdir())) == 2


def test_a_torn_archive_gets_no_marker_and_warns_in_every_process(tmp_path, own_cache):
    root = tmp_path / "outputs"
    _plain(root / "sessions" / "a", [{"kind": "fwd", "chapter": "n1", "n": n} for n in range(3)], tail='{"kind": "fw')
    record.compress(root / "sessions" / "a")
    for _ in range(2):
        record._clean_files.clear()
        with pytest.warns(record.TornLineWarning, match="records.jsonl.gz:4"):
            assert [r["n"] for r in record.load(root, chapter="n1")] == [0, 1, 2]
    assert not (own_cache / "records-clean").exists()
    cut = root / "cut" / "sessions" / "b" / record.RECORDS_GZ  # an archive cut in its trailer: every row, damaged gzip
    cut.parent.mkdir(parents=True)
    cut.write_bytes(gzip.compress(b"".join(b'{"chapter": "n2", "n": %d}\n' % n for n in range(50)))[:-8])
    for _ in range(2):
        record._clean_files.clear()
        with pytest.warns(record.TornLineWarning, match="damaged gzip data"):
            assert [r["n"] for r in record.load(root / "cut", chapter="n2")] == list(range(50))
    assert not (own_cache / "records-clean").exists()


def test_a_second_load_of_a_plain_file_sees_rows_appended_since(tmp_path):
    """A plain records.jsonl read whole is skimmed by its plain strings on the next load; a row appended after
    that (a session still running) changes its size and mtime, so the next load reads it whole again."""
    root = tmp_path / "outputs"
    folder = root / "sessions" / "a"
    _plain(folder, [{"kind": "fwd", "chapter": "n10", "n": 0}, {"kind": "bwd", "chapter": "n10", "n": 1}])
    assert [r["n"] for r in record.load(root, kind="fwd")] == [0]
    assert [r["n"] for r in record.load(root, kind="fwd")] == [0]  # skimmed: the same rows
    record.append({"kind": "fwd", "chapter": "n10", "n": 2}, folder=folder, env={"gpu": "cpu"})
    assert [r["n"] for r in record.load(root, kind="fwd")] == [0, 2]
    assert [r["n"] for r in record.load(root, kind="fwd", chapter="n10")] == [0, 2]
    assert [r["n"] for r in record.load(root, chapter="n10")] == [0, 1, 2]


def test_an_archive_with_a_torn_line_warns_on_every_load(tmp_path):
    """Also when it replaces a clean archive that was read before: the new one is read whole, never skimmed."""
    folder = tmp_path / "outputs" / "s"
    _plain(folder, [{"kind": "fwd", "n": 1}])
    record.compress(folder)
    assert [r["n"] for r in record.load(tmp_path / "outputs", kind="fwd")] == [1]
    _plain(folder, [], tail='{"kind": "fwd", "n": 2, "torn')
    record.compress(folder)
    for _ in range(2):
        with pytest.warns(record.TornLineWarning, match=r"records.jsonl.gz:2: skipped a torn record line"):
            assert [r["n"] for r in record.load(tmp_path / "outputs", kind="fwd")] == [1]
