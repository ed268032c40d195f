"""lab/publish/clean.py: what a reader sees of a published chapter copy (no progress bars, warnings or machine
paths; long and wide tables folded), and the published copies themselves checked for machine paths."""
from __future__ import annotations

import gzip
import json
import re
import subprocess

import nbformat
import pytest

from lab import paths, toc
from lab.publish import chapters, clean, pages

# the usual roots, and the running checkout's own (a clone under /check/work/main names /check/...)
MACHINE_PATH = re.compile(r"(?<![\w.~$}-])/(?:root|home|tmp|work|opt|"
                          + re.escape(paths.ROOT.resolve().parts[1]) + ")/")
BINARY = ("image/", "application/pdf")


def _texts(value, key=""):
    """Every string of a notebook or page, image data left out (base64 may hold '/tmp/' by chance)."""
    if isinstance(value, str):
        if not key.startswith(BINARY):
            yield value
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v, key)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _texts(v, k)


def machine_paths(path) -> list[str]:
    """The machine paths a notebook, a page or a session file (records.jsonl.gz gunzipped) names; a binary
    file (a figure) holds none a reader sees."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return []
    data = json.loads(text) if path.suffix == ".ipynb" else text
    return [m.group(0) + t[m.end():m.end() + 40] for t in _texts(data) for m in MACHINE_PATH.finditer(t)]


def _stream(text, name="stdout"):
    return nbformat.v4.new_output("stream", name=name, text=text)


def _notebook(*outputs, metadata=None):
    nb = nbformat.v4.new_notebook(metadata=metadata or {})
    cell = nbformat.v4.new_code_cell("run()")
    cell.outputs = list(outputs)
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), cell]
    return nb


def test_stderr_keeps_what_a_reader_needs_and_drops_progress_and_warnings():
    text = ("\rfwd sweep:   0%|          | 0/16 [00:00<?, ?it/s]\rfwd sweep:  56%|█████▋    | 9/16 [00:05<00:04]\n"
            "/work/main/lab/bench.py:143: UserWarning: Memory efficient kernel not used because: (Triggered)\n"
            "  return fn()\n"
            "W1127 03:00:05.146000 1813 torch/_dynamo/convert_frame.py:1743] [0/8] torch._dynamo hit config.recompile\n"
            "\r                                                 \r\n"
            "kernel v04 fell back to v03\n")
    assert clean.quiet_stderr(text) == "kernel v04 fell back to v03\n"
    assert clean.quiet_stderr("\rcheck v01:  94%|█████████▍| 34/36 [00:05<00:00]\r    \r") == ""
    # a warning whose message runs over two lines goes whole, with its source line; what follows stays
    torch_warning = ("/work/main/lab/check.py:85: UserWarning: Converting a tensor with requires_grad=True to a scalar "
                     "may lead to unexpected results.\nConsider using tensor.detach() first. (Triggered internally at "
                     "/pytorch/torch/csrc/autograd/generated/python_variable_methods.cpp:836.)\n"
                     "  sd_max = float(sd_err.max()) if sd_err.numel() else 0.0\nkernel v12 fell back to v10\n")
    assert clean.quiet_stderr(torch_warning) == "kernel v12 fell back to v10\n"
    # a header without a source line within reach is one line: the text after it is no part of it
    short = "x.py:3: UserWarning: short\nchecks: 12/12 pass\n\nnext\n"
    assert clean.quiet_stderr(short) == "checks: 12/12 pass\nnext\n"


@pytest.mark.parametrize("raw, shown", [
    ("/work/main/lab/bench.py:192", "lab/bench.py:192"),
    ("/root/lab-checkout/kernels/fwd/v04_lazy.cu(12)", "kernels/fwd/v04_lazy.cu(12)"),
    ("/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/attention/flex_attention.py:1704",
     "site-packages/torch/nn/attention/flex_attention.py:1704"),
    ("--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD", "--target ${TMPDIR:-/tmp}/site .whl/*.whl "
     "&& export PYTHONPATH=${TMPDIR:-/tmp}/site:$PWD"),
    ("see /home/ana/notes.txt", "see ~/notes.txt"),
    ("kernels/fwd/v04.cu and https://example.org/tmp/x stay", "kernels/fwd/v04.cu and https://example.org/tmp/x stay"),
])
def test_machine_paths_become_paths_a_reader_can_use(raw, shown):
    assert clean.scrub(raw) == shown and not MACHINE_PATH.search(clean.scrub(raw))


def test_paths_of_a_checkout_under_an_unlisted_root_are_scrubbed_too():
    """A clone under a folder of its own (CI's /check/work/main) names its files by that root; the running checkout's
    root is always among the scrubbed ones, and any other root can be named."""
    here = f"{paths.ROOT}/lab/bench.py:192"
    assert clean.scrub(here) == "lab/bench.py:192"
    check = clean.path_pattern(("check",))
    raw = "/check/work/main/kernels/fwd/v07_overlap.cu(12) and /check/tmp/x.log"
    assert check.sub(clean.machine_path, raw) == "kernels/fwd/v07_overlap.cu(12) and …/x.log"
    assert check.sub(clean.machine_path, "/checkout/lab/x.py") == "/checkout/lab/x.py"  # a whole folder name only


def test_a_long_wide_text_output_shows_its_first_rows_and_folds_the_rest():
    table = "\n".join(f"row {i:03d} " + "x" * 300 for i in range(250)) + "\n"
    nb = clean.clean(_notebook(_stream(table[:5000]), _stream(table[5000:])))
    nbformat.validate(nb)
    head, whole = nb.cells[1].outputs
    assert head.output_type == "stream" and head.text.count("\n") == clean.HEAD_LINES + 1
    assert max(len(line) for line in head.text.splitlines()) <= clean.MAX_WIDTH and "235 more lines" in head.text
    markdown = whole.data["text/markdown"]
    assert markdown.startswith("<details>") and "250 lines, up to 308 characters wide" in markdown
    assert all(f"row {i:03d} " in markdown for i in range(250))  # the whole output, once
    short = clean.clean(_notebook(_stream("one line\n"), _stream("two\n")))
    assert [o.text for o in short.cells[1].outputs] == ["one line\ntwo\n"]  # merged, otherwise as printed


def test_a_long_markdown_table_shows_its_first_rows_and_folds_the_rest():
    rows = "\n".join(f"| case {i} | {i * 0.5:.2f} |" for i in range(750))
    out = nbformat.v4.new_output("display_data", data={"text/markdown": f"**750/750 pass**\n\n| case | x |\n|---|---|\n{rows}"})
    head, whole = clean.clean(_notebook(out)).cells[1].outputs
    shown = head.data["text/markdown"]
    assert shown.startswith("**750/750 pass**") and "| case 14 |" in shown and "| case 15 |" not in shown
    assert "735 more rows" in shown and "| case 749 |" in whole.data["text/markdown"]
    wide = "| " + " | ".join(f"c{i}" for i in range(30)) + " |\n|" + "---|" * 30 + "\n| " + " | ".join("1" * 30) + " |"
    head, _ = clean.clean(_notebook(nbformat.v4.new_output("display_data", data={"text/markdown": wide}))).cells[1].outputs
    assert head.data["text/markdown"].splitlines()[0].count("|") == clean.MAX_COLUMNS + 2 and "20 more columns" in \
        head.data["text/markdown"]


def test_metadata_and_tracebacks_lose_their_machine_paths_and_images_stay_as_they_are():
    image = "iVBORw0KGgo/tmp/AAAA"  # base64 can hold the characters of a path: never touched
    error = nbformat.v4.new_output("error", ename="ValueError", evalue="bad",
                                   traceback=["File /root/work/lab/ops.py:3, in attention", "ValueError: bad"])
    picture = nbformat.v4.new_output("display_data", data={"image/png": image, "text/plain": "<Figure>"})
    nb = clean.clean(_notebook(error, picture, metadata={"papermill": {"input_path": "/work/main/chapters/n4.ipynb"}}))
    assert nb.metadata.papermill.input_path == "chapters/n4.ipynb"
    assert nb.cells[1].outputs[0].traceback[0] == "File lab/ops.py:3, in attention"
    assert nb.cells[1].outputs[1].data["image/png"] == image


def test_published_chapters_and_log_pages_hold_no_machine_paths(tmp_path):
    """Every chapter copy the log would publish from the committed sessions, and the copies and log pages already
    generated in outputs/ (`python -m lab log`), name no absolute path of the machine that ran them."""
    sessions = pages.load_sessions(paths.OUTPUTS)
    chapters.publish(tmp_path, sessions, toc.chapters())
    published = sorted((tmp_path / "book").glob("*.ipynb"))
    assert published
    generated = [*sorted((paths.OUTPUTS / "book").glob("*.ipynb")), *sorted((paths.OUTPUTS / "log").glob("*.md"))]
    found = {p.name if p.is_relative_to(tmp_path) else paths.relative(p): machine_paths(p)[:3]
             for p in published + generated}
    assert not {name: hits for name, hits in found.items() if hits}
    for path in published:  # and no progress bar or warning
        nb = json.loads(path.read_text())
        stderr = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", [])
                         if o.get("name") == "stderr")
        assert "it/s]" not in stderr and "Warning:" not in stderr, path.name


def test_committed_outputs_hold_no_machine_paths():
    """Everything committed under outputs/ (sessions' executed notebooks and records, driver logs, experiments,
    profiles), which the log and the chapters read and a reader of the repository opens directly, names no absolute
    path of the machine that ran it."""
    names = subprocess.run(["git", "ls-files", "-z", "outputs"], cwd=paths.ROOT, capture_output=True,
                           text=True).stdout.split("\0")
    committed = [paths.ROOT / name for name in names if name and (paths.ROOT / name).is_file()]
    if not committed:
        pytest.skip("not a git checkout: no list of committed session files")
    found = {paths.relative(p): machine_paths(p)[:3] for p in committed}
    assert not {name: hits for name, hits in found.items() if hits}


def test_machine_paths_finds_paths_in_notebooks_records_and_logs_but_not_in_images(tmp_path):
    nb = _notebook(_stream("built in /work/main/kernels\n"),
                   nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo/tmp/AAAA"}))
    (tmp_path / "a.ipynb").write_text(nbformat.writes(nb))
    (tmp_path / "records.jsonl.gz").write_bytes(gzip.compress(b'{"python": "3.12 (/opt/torch/.venv/bin/python3)"}\n'))
    (tmp_path / "run.log").write_text("cd /root/lab && make\n")
    (tmp_path / "fig.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff/tmp/")
    assert [len(machine_paths(tmp_path / n)) for n in ("a.ipynb", "records.jsonl.gz", "run.log", "fig.png")] == [1, 1, 1, 0]
