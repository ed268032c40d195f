"""The scripts kept in tools/ run: the standalone drivers compile, the sanitizer scripts build and sanitize what
lab.registry lists, and the SASS guard gives each verdict it can give.

The sanitizer scripts and the guard run as they are, with nvidia-smi, nvcc, compute-sanitizer and cuobjdump
replaced by small stand-ins on PATH (no GPU, no CUDA toolkit needed): what is tested is the scripts' own logic.
The driver compile check needs nvcc.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab import paths, registry

ROOT = paths.ROOT
requires_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def gpu_stubs(tmp_path):
    """A PATH with a Hopper GPU's nvidia-smi, an nvcc that writes a driver binary printing PASS, and a
    compute-sanitizer that runs the binary and reports STUB_ERRORS errors for the (tool, binary) in STUB_FAIL."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "calls.log"
    _stub(stubs, "nvidia-smi", """case "$*" in
  *name,driver*) echo "name, driver_version, compute_cap"; echo "NVIDIA H200, 570.00, 9.0" ;;
  *) echo "9.0" ;;
esac
""")
    _stub(stubs, "nvcc", f"""echo "nvcc $*" >> {calls}
[ "$1" = --version ] && {{ echo "Cuda compilation tools, release 13.0"; exit 0; }}
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
printf '#!/bin/bash\\necho "PASS case 1"; echo "PASS case 2"\\n' > "$out"; chmod +x "$out"
""")
    _stub(stubs, "compute-sanitizer", f"""echo "compute-sanitizer $*" >> {calls}
[ "$1" = --version ] && {{ echo "NVIDIA (R) Compute Sanitizer"; echo "Version 2025.3.0"; exit 0; }}
tool=$2; shift 2
errors=0; [ "$tool:$(basename "$1")" = "${{STUB_FAIL:-}}" ] && errors=${{STUB_ERRORS:-0}}
case $1 in */*) "$@" ;; esac
if [ "$tool" = racecheck ]; then echo "========= RACECHECK SUMMARY: $errors hazards displayed (0 errors, 0 warnings)"
else echo "========= ERROR SUMMARY: $errors errors"; fi
[ "$errors" = 0 ]
""")
    os.symlink(sys.executable, stubs / "python3")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "OUT": str(tmp_path / "out")}
    return env, calls


def _summary(log: str) -> dict[tuple[str, str], dict[str, int]]:
    rows = re.findall(r"^(\w+)\s+(\w+)\s+errors=(\d+) hazards=(\d+) runs=(\d+) summaries=(\d+) nonzero_rc=(\d+)$",
                      log, re.M)
    keys = ("errors", "hazards", "runs", "summaries", "nonzero_rc")
    return {(tool, name): dict(zip(keys, map(int, counts))) for tool, name, *counts in rows}


def test_sanitize_all_builds_every_default_driver_of_the_gpu_and_runs_four_tools(gpu_stubs):
    env, calls = gpu_stubs
    run = subprocess.run(["bash", "tools/gpu/sanitize_all.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    log = (Path(env["OUT"]) / "sanitize.log").read_text()
    rows = [r for r in registry.drivers((9, 0), defaults_only=True) if r[0] != "fwd_v01"]
    names = [r[0] for r in rows]
    assert re.search(r"^binaries: (.*)$", log, re.M)[1].split() == names
    nvcc = calls.read_text()
    for name, main, source, define in rows:
        assert f"{define} {main} {source} -o " in nvcc and "arch=compute_90a,code=sm_90a" in nvcc, name
    summary = _summary(log)
    assert set(summary) == {(t, n) for t in ("memcheck", "racecheck", "initcheck", "synccheck") for n in names}
    for (tool, name), counts in summary.items():
        assert counts["runs"] == (4 if name.startswith("fwd_") else 1) == counts["summaries"], (tool, name)
        assert counts["errors"] == counts["hazards"] == counts["nonzero_rc"] == 0, (tool, name)


def test_sanitize_all_summary_counts_a_sanitizer_error(gpu_stubs):
    env, _ = gpu_stubs
    failing = [r[0] for r in registry.drivers((9, 0), defaults_only=True) if r[0].startswith("decode_")][0]
    env = {**env, "STUB_FAIL": f"racecheck:{failing}", "STUB_ERRORS": "3"}
    run = subprocess.run(["bash", "tools/gpu/sanitize_all.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    summary = _summary((Path(env["OUT"]) / "sanitize.log").read_text())
    assert summary[("racecheck", failing)]["hazards"] == 3 and summary[("racecheck", failing)]["nonzero_rc"] == 1
    assert sum(c["hazards"] + c["errors"] + c["nonzero_rc"] for c in summary.values()) == 4


def test_sanitize_paged_builds_decode_v03_and_runs_the_paged_tests_under_memcheck(gpu_stubs):
    env, calls = gpu_stubs
    run = subprocess.run(["bash", "tools/gpu/sanitize_paged.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"-DDECODE_FN={registry.DECODE['v03'].symbol} tools/gpu/decode_main.cu kernels/decode/v03_paged.cu" in \
        calls.read_text()
    log = (Path(env["OUT"]) / "sanitize_paged.log").read_text()
    for tool in ("memcheck", "racecheck", "initcheck", "synccheck"):
        assert f"== compute-sanitizer --tool {tool} dec_v03 --sanitize" in log
    pytest_line = r"compute-sanitizer --tool memcheck --target-processes all \S+ -m pytest .*tests/decode/test_paged_gpu.py"
    assert re.search(pytest_line, calls.read_text())
    assert log.count("ERROR SUMMARY: 0 errors") == 4 and log.count("rc=0") == 6


@requires_nvcc
@pytest.mark.parametrize("main", sorted({r[1] for r in registry.drivers()}))
def test_each_driver_compiles_with_a_registered_kernel_symbol(main, tmp_path):
    define = next(r[3] for r in registry.drivers() if r[1] == main)
    run = subprocess.run(["nvcc", "-std=c++17", "-O0", "-I", "kernels", "-gencode", "arch=compute_80,code=sm_80",
                          *define.split(), "-c", main, "-o", str(tmp_path / "driver.o")],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


# ------------------------------------------------------------------ the SASS guard

KERNEL = """        Function : attn_a
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FADD R2, R3, R4 ;
        /*0020*/                   EXIT ;
        Function : attn_b
        /*0000*/                   FMUL R5, R6, R7 ;
        /*0010*/                   EXIT ;
"""


@pytest.fixture
def guard(tmp_path):
    """A repository whose kernels/k.cu is a SASS listing, an nvcc that copies it into the cubin, a cuobjdump
    that prints it: the guard compares the listing at HEAD with the one in the working tree."""
    repo, stubs = tmp_path / "repo", tmp_path / "bin"
    (repo / "kernels").mkdir(parents=True)
    stubs.mkdir()
    (repo / "kernels/k.cu").write_text(KERNEL)
    git = ["git", "-c", "user.name=lab", "-c", "user.email=lab@localhost"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "kernels"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], cwd=repo, check=True)
    _stub(stubs, "nvcc", """[ "$1" = --version ] && { echo "Cuda compilation tools, release 13.0"; exit 0; }
while [ $# -gt 0 ]; do case $1 in -cubin) src=$2 ;; -o) out=$2 ;; esac; shift; done
cp "$src" "$out"
""")
    _stub(stubs, "cuobjdump", 'cat "$2"\n')
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}

    def verdicts(listing: str) -> list[str]:
        (repo / "kernels/k.cu").write_text(listing)
        run = subprocess.run(["bash", str(ROOT / "tools/sass/sass_guard.sh"), "HEAD", "kernels/k.cu"], cwd=repo,
                             env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        assert lines[0].startswith("sass_guard: base ")
        return lines[1:]
    return verdicts


def test_sass_guard_finds_identical_sass_for_both_archs(guard):
    out = guard(KERNEL)
    assert out == ["kernels/k.cu sm_80: identical SASS (5 instructions)",
                   "kernels/k.cu sm_90a: identical SASS (5 instructions)"]


def test_sass_guard_tells_renamed_registers_reordered_and_added_kernels_apart(guard):
    assert guard(KERNEL.replace("R5, R6, R7", "R8, R6, R7"))[0].endswith("same opcode sequence, registers renamed")
    a, b = KERNEL.split("        Function : attn_b\n")
    assert guard("        Function : attn_b\n" + b + a)[0].endswith(
        "identical SASS per kernel, kernels in another order in the cubin")
    extra = "        Function : attn_c\n        /*0000*/                   EXIT ;\n"
    assert "every base kernel has an identical kernel in the tree (2 base, 3 tree kernels)" in guard(KERNEL + extra)[0]


def test_sass_guard_reports_a_changed_kernel_with_its_opcode_counts(guard):
    out = guard(KERNEL.replace("FADD R2, R3, R4", "FMUL R2, R3, R4"))
    assert out[0] == ("kernels/k.cu sm_80: DIFFERENT, 5 -> 5 instructions; 1 of 2 base kernels without an identical "
                      "tree kernel; opcode counts before | after:")
    assert [line.split() for line in out[1:4]] == [["<", "1", "FADD"], ["<", "1", "FMUL"], [">", "2", "FMUL"]]
