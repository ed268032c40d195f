"""lab.files and lab.record on a full disk and a read-only folder: a clear error naming the path, no
half-written file, no leftover temp file, no torn line.

Three ways to get the failure: a mocked ENOSPC/EROFS (always runs), a real tmpfs that is full or mounted
read-only (needs mount rights, skipped otherwise), and chmod (skipped as root, where it stops nothing).
"""
from __future__ import annotations

import errno
import json
import os
import subprocess
import uuid
import warnings
from pathlib import Path

import pytest

from lab import files, record


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_atomic_replaces_whole_file(tmp_path):
    target = tmp_path / "sub" / "session.json"
    files.write_atomic(target, '{"a": 1}\n')
    files.write_atomic(target, '{"a": 2}\n')
    assert json.loads(target.read_text()) == {"a": 2} and _leftovers(target.parent) == []


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "disk is full"), (errno.EROFS, "read-only")])
def test_write_atomic_failure_names_the_path_and_keeps_the_old_file(tmp_path, monkeypatch, code, words):
    target = tmp_path / "session.json"
    files.write_atomic(target, '{"status": "running"}\n')

    def no_space(fd, *args):  # the data write fails half-way, as on a full disk
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(files.os, "fsync", no_space)
    with pytest.raises(files.OutputError) as info:
        files.write_atomic(target, '{"status": "complete"}\n')
    assert str(target) in str(info.value) and words in str(info.value) and info.value.errno == code
    assert json.loads(target.read_text()) == {"status": "running"}  # the old, whole file
    assert _leftovers(tmp_path) == []


def test_append_line_failure_leaves_no_partial_line(tmp_path, monkeypatch):
    path = tmp_path / "records.jsonl"
    files.append_line(path, '{"n": 1}')
    real_open = open

    class HalfWriter:
        """Writes half of what it is given, then fails like a disk that just filled up."""

        def __init__(self, handle):
            self.handle, self.calls = handle, 0

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            self.calls += 1
            if self.calls == 1:
                return self.handle.write(bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("builtins.open", lambda *a, **k: HalfWriter(real_open(*a, **k)))
    with pytest.raises(files.OutputError, match="records.jsonl: the disk is full"):
        files.append_line(path, '{"n": 2, "payload": "' + "x" * 100 + '"}')
    monkeypatch.undo()
    assert path.read_text() == '{"n": 1}\n'  # cut back: no torn line for the next reader


def test_append_after_a_torn_line_starts_a_new_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"n": 1}\n{"n": 2, "torn')  # a killed writer left half a line
    files.append_line(path, '{"n": 3}')
    with pytest.warns(record.TornLineWarning, match=r"records.jsonl:2: skipped a torn record line"):
        rows = record.read(path)
    assert [r["n"] for r in rows] == [1, 3]


def test_read_only_folder_with_chmod(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("running as root: chmod does not stop root's writes (the mocked EROFS and tmpfs tests cover it)")
    folder = tmp_path / "ro"
    folder.mkdir()
    files.write_atomic(folder / "session.json", "{}\n")
    folder.chmod(0o555)
    try:
        with pytest.raises(files.OutputError, match=f"cannot write {folder / 'session.json'}: permission denied"):
            files.write_atomic(folder / "session.json", '{"x": 1}\n')
        assert (folder / "session.json").read_text() == "{}\n" and _leftovers(folder) == []
    finally:
        folder.chmod(0o755)


@pytest.fixture
def tmpfs(tmp_path):
    """A 64 KiB tmpfs of our own (root with mount rights only); unmounted afterwards."""
    mount = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip() or 'mount failed'}")
    yield mount
    subprocess.run(["umount", str(mount)], capture_output=True)


def test_real_full_disk(tmpfs):
    target = tmpfs / "session.json"
    files.write_atomic(target, '{"status": "running"}\n')
    records = tmpfs / "records.jsonl"
    files.append_line(records, '{"n": 1}')
    filler = tmpfs / "filler"
    with open(filler, "wb", buffering=0) as handle:  # fill the disk to the last block
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    with pytest.raises(files.OutputError, match="the disk is full"):
        files.write_atomic(target, '{"status": "complete", "pad": "' + "x" * 8192 + '"}\n')
    assert json.loads(target.read_text()) == {"status": "running"} and _leftovers(tmpfs) == []
    with pytest.raises(files.OutputError, match="records.jsonl: the disk is full"):
        files.append_line(records, '{"n": 2, "pad": "' + "x" * 8192 + '"}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torn line may be left behind
        assert record.read(records) == [{"n": 1}]


def test_real_read_only_mount(tmpfs):
    files.write_atomic(tmpfs / "session.json", "{}\n")
    remount = subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], capture_output=True)
    if remount.returncode != 0:
        pytest.skip("cannot remount the tmpfs read-only")
    try:
        with pytest.raises(files.OutputError, match="the file system is read-only"):
            files.write_atomic(tmpfs / "session.json", '{"x": 1}\n')
        with pytest.raises(files.OutputError, match="records.jsonl: the file system is read-only"):
            files.append_line(tmpfs / "records.jsonl", "{}")
        assert (tmpfs / "session.json").read_text() == "{}\n"
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tmpfs)], capture_output=True)
