"""lab/build.py: cache keys, nvcc error mapping, the ptxas parser on real nvcc output, arch selection,
the kernel library cache, and the compile gate over every kernel in kernels/ (sm_80 and sm_90a).

Needs nvcc (no GPU). Run: .venv/bin/python -m pytest -q tests/product/test_build.py
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from lab import build, paths

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BROKEN = FIXTURES / "broken_kernel.cu"
BROKEN_INCLUDE = FIXTURES / "broken_include.cu"
BROKEN_HEADER = FIXTURES / "broken_header.cuh"

requires_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def marker_line(path: Path, marker: str) -> tuple[int, str]:
    """1-based line number and stripped text of the line holding `marker`."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            return number, line.strip()
    raise AssertionError(f"marker {marker!r} not found in {path}")


# ------------------------------------------------------------------ cache key

@pytest.fixture
def tree(tmp_path):
    """main.cu -> inc/a.cuh -> inc/b.cuh -> inc/a.cuh (a cycle), plus common/params.h found via kernels/."""
    (tmp_path / "inc").mkdir()
    main = tmp_path / "main.cu"
    main.write_text('#include "inc/a.cuh"\n#include "common/params.h"\n#include <cuda_fp16.h>\n'
                    "__global__ void k() {}\n")
    (tmp_path / "inc" / "a.cuh").write_text('#pragma once\n#include "b.cuh"\nconstexpr int A = 1;\n')
    (tmp_path / "inc" / "b.cuh").write_text('#pragma once\n  #  include "a.cuh"\nconstexpr int B = 2;\n')
    (tmp_path / "unrelated.cuh").write_text("constexpr int U = 3;\n")
    return tmp_path


def test_source_closure_follows_nested_includes_and_the_kernels_folder(tree):
    closure = build.source_closure(tree / "main.cu")
    assert set(closure) == {
        (tree / "main.cu").resolve(),
        (tree / "inc" / "a.cuh").resolve(),
        (tree / "inc" / "b.cuh").resolve(),  # included by a.cuh, relative to a.cuh's folder
        (paths.KERNELS / "common" / "params.h").resolve(),  # not beside main.cu: found under kernels/
    }
    assert len(closure) == len(set(closure)), "the include cycle a.cuh <-> b.cuh must not repeat files"
    assert closure[0] == (tree / "main.cu").resolve()


def test_source_closure_of_every_version_includes_the_params_header():
    """Every version in the registry launches over a params struct of common/params.h (the binding's ABI). A helper
    file outside the registry (the FP8 training casts, called through ctypes) takes plain arguments instead."""
    from lab import registry

    sources = {(paths.KERNELS / kernel.source).resolve() for table in registry.TABLES.values()
               for kernel in table.values()}
    assert len(sources) > 30, "the registry lists the kernel files"
    params = (paths.KERNELS / "common" / "params.h").resolve()
    for source in sorted(sources):
        assert params in build.source_closure(source), f"{paths.relative(source)} does not include common/params.h"


def test_cache_key_is_stable_for_the_same_inputs(tree):
    flags = [*build.BASE_FLAGS, *build.check_arch_flags("sm_80")]
    key = build.cache_key(tree / "main.cu", flags)
    assert re.fullmatch(r"[0-9a-f]{16}", key)
    assert build.cache_key(tree / "main.cu", list(flags)) == key
    # rewriting a file with identical bytes (new mtime) and editing a file nobody includes change nothing
    (tree / "inc" / "b.cuh").write_text((tree / "inc" / "b.cuh").read_text())
    (tree / "unrelated.cuh").write_text("constexpr int U = 4;\n")
    assert build.cache_key(tree / "main.cu", flags) == key


def test_cache_key_changes_with_the_cu_file(tree):
    key = build.cache_key(tree / "main.cu", ["-O3"])
    (tree / "main.cu").write_text((tree / "main.cu").read_text() + "// edit\n")
    assert build.cache_key(tree / "main.cu", ["-O3"]) != key


def test_cache_key_changes_with_a_nested_header(tree):
    key = build.cache_key(tree / "main.cu", ["-O3"])
    (tree / "inc" / "b.cuh").write_text((tree / "inc" / "b.cuh").read_text().replace("B = 2", "B = 5"))
    assert build.cache_key(tree / "main.cu", ["-O3"]) != key


@pytest.mark.parametrize("flags_a, flags_b", [
    (["-O3"], ["-O2"]),
    (["-DLAB_X=1"], ["-DLAB_X=2"]),
    ([], ["-DLAB_BUG_LAYOUT"]),
    (build.check_arch_flags("sm_80"), build.check_arch_flags("sm_90a")),
    (build.arch_flags((8, 0)), build.arch_flags((8, 9))),
])
def test_cache_key_changes_with_flags_defines_and_arch(tree, flags_a, flags_b):
    assert build.cache_key(tree / "main.cu", flags_a) != build.cache_key(tree / "main.cu", flags_b)


def test_cache_key_changes_with_extra(tree):
    assert build.cache_key(tree / "main.cu", [], {"torch": "2.13"}) != build.cache_key(tree / "main.cu", [], {"torch": "2.14"})
    assert build.cache_key(tree / "main.cu", [], {}) == build.cache_key(tree / "main.cu", [], None)


def test_a_define_no_source_reads_is_an_error_naming_the_switches():
    """A typo in a switch's name would build the default unchanged (an A/B of a build with itself): every entry
    that takes defines refuses it before nvcc runs, and names the switches the file and its headers have."""
    source = "kernels/bwd/v22_fp8.cu"
    build.check_defines(source, {"LAB_BWD_FP8_DQ_TWO": 0})  # a switch of the file itself
    build.check_defines(source, ["LAB_BWD_ZERO_IN_PRE=1"])  # one a header reads
    build.check_defines(source, None)
    for call in (lambda d: build.build_kernel(source, defines=d, arch=["-gencode", "arch=compute_90a,code=sm_90a"]),
                 lambda d: build.compile_check(("sm_80",), sources=[source], defines=d),
                 lambda d: build.ptx(source, "sm_80", defines=d),
                 lambda d: build.check_defines(source, d)):
        with pytest.raises(ValueError) as info:
            call({"LAB_BWD_FP8_DQ_TW0": 0, "LAB_BWD_FP8_LEAN": 0})
        message = str(info.value)
        assert message.startswith("define 'LAB_BWD_FP8_DQ_TW0': neither kernels/bwd/v22_fp8.cu nor its headers")
        assert "LAB_BWD_FP8_LEAN'" not in message  # the one it reads is not named
        assert "its switches: " in message and "LAB_BWD_FP8_DQ_TWO, " in message and "LAB_BWD_ZERO_IN_PRE" in message


def test_define_flags():
    assert build._define_flags(None) == []
    assert build._define_flags({"B": 2, "A": None}) == ["-DA", "-DB=2"]
    assert build._define_flags(["LAB_BUG_LAYOUT"]) == ["-DLAB_BUG_LAYOUT"]


def test_source_hash_and_kernel_path_resolution():
    source = build.kernel_sources()[0]
    rel_to_kernels = str(source.relative_to(paths.KERNELS))
    assert build._kernel_path(rel_to_kernels) == source
    assert build._kernel_path(f"kernels/{rel_to_kernels}") == source
    assert build.source_hash(rel_to_kernels) == build.source_hash(source) == build.source_hash(f"kernels/{rel_to_kernels}")
    if len(build.kernel_sources()) > 1:
        assert build.source_hash(build.kernel_sources()[1]) != build.source_hash(source)
    with pytest.raises(build.BuildError, match=r"kernel source not found: kernels/fwd/v99_missing\.cu"):
        build._kernel_path("fwd/v99_missing.cu")


# ------------------------------------------------------------------ arch selection

@pytest.mark.parametrize("capability, expected", [
    ((9, 0), ["-gencode=arch=compute_90a,code=sm_90a"]),
    ((8, 9), ["-gencode=arch=compute_89,code=sm_89"]),
    ((8, 0), ["-gencode=arch=compute_80,code=sm_80"]),
    ((8, 6), ["-gencode=arch=compute_80,code=sm_80"]),
    ((8, 7), ["-gencode=arch=compute_80,code=sm_80"]),
    ((10, 0), ["-gencode=arch=compute_100,code=sm_100"]),
    ((12, 0), ["-gencode=arch=compute_120,code=sm_120"]),
])
def test_arch_flags(capability, expected):
    assert build.arch_flags(capability) == expected


@pytest.mark.parametrize("capability", [(7, 5), (7, 0), (6, 1)])
def test_arch_flags_rejects_pre_ampere(capability):
    with pytest.raises(build.BuildError) as info:
        build.arch_flags(capability)
    message = str(info.value)
    assert f"compute capability {capability[0]}.{capability[1]}" in message
    assert "sm_80" in message


def test_check_arch_flags():
    assert build.check_arch_flags("sm_80") == ["-gencode=arch=compute_80,code=sm_80"]
    assert build.check_arch_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert build.CHECK_ARCHS == ("sm_80", "sm_90a")


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the no-GPU message")
def test_device_arch_flags_without_gpu_explains_why():
    with pytest.raises(build.BuildError, match="no CUDA device"):
        build.device_arch_flags()


@pytest.mark.skipif(torch.version.cuda is not None, reason="tests the CPU-only torch message")
def test_binding_on_cpu_only_torch_explains_why(monkeypatch):
    monkeypatch.setattr(build, "_binding", None)
    with pytest.raises(build.BuildError, match="CPU-only build"):
        build.binding()


def test_missing_nvcc_is_a_clear_build_error(monkeypatch):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(build.BuildError, match="nvcc not found"):
        build.run_nvcc(["--version"], "nothing")


# ------------------------------------------------------------------ error mapping

@requires_nvcc
def test_compile_check_maps_errors_to_the_fixture_line():
    line, text = marker_line(BROKEN, "BROKEN:")
    with pytest.raises(build.BuildError) as info:
        build.compile_check(archs=("sm_80",), sources=[BROKEN])
    err = info.value
    message = str(err)
    assert message.splitlines()[0] == "nvcc failed to build tests/fixtures/broken_kernel.cu for sm_80"
    assert f"tests/fixtures/broken_kernel.cu:{line}: error: " in message
    assert "undeclared_scale_factor" in message
    assert f"| {text}" in message  # the source line itself, read from the fixture
    assert "tmpxft" not in message and "/tmp/" not in message
    assert len(err.diagnostics) == 1
    diag = err.diagnostics[0]
    assert diag["path"] == "tests/fixtures/broken_kernel.cu" and diag["line"] == line and diag["kind"] == "error"
    assert diag["source"] == text
    assert "undeclared_scale_factor" in err.log  # the full nvcc log is kept


@requires_nvcc
def test_a_failed_nvcc_run_leaves_nothing_in_the_temp_folder(tmp_path, monkeypatch):
    """nvcc's front end can leave an empty <file>-<hash>..lgenfe.bc in TMPDIR when a file fails to compile (five a
    test run, found accumulating in /tmp); each run gets a temp folder of its own, removed after it."""
    system = tmp_path / "tmp"
    system.mkdir()
    monkeypatch.setenv("TMPDIR", str(system))
    monkeypatch.setattr(tempfile, "tempdir", str(system))
    monkeypatch.setattr(paths, "CACHE", tmp_path / "cache")  # a cold cache, so nvcc runs
    with pytest.raises(build.BuildError):
        build.compile_check(archs=("sm_80",), sources=[BROKEN])
    assert list(system.iterdir()) == []


@requires_nvcc
def test_run_nvcc_error_in_an_included_header_names_the_header(tmp_path):
    line, text = marker_line(BROKEN_HEADER, "BROKEN-HEADER:")
    with pytest.raises(build.BuildError) as info:
        build.run_nvcc([*build.BASE_FLAGS, *build.check_arch_flags("sm_80"), "-c", paths.relative(BROKEN_INCLUDE),
                        "-o", str(tmp_path / "x.o")], "the include fixture")
    message = str(info.value)
    assert message.startswith("nvcc failed to build the include fixture")
    assert f"tests/fixtures/broken_header.cuh:{line}: error: " in message
    assert f"| {text}" in message
    assert not (tmp_path / "x.o").exists()


def test_diagnostics_parsing_of_a_synthetic_log(tmp_path):
    line, text = marker_line(BROKEN, "BROKEN:")
    outside = tmp_path / "outside.cu"
    outside.write_text("int a;\nint b = c;\n")
    log = "\n".join([
        f'tests/fixtures/broken_kernel.cu({line - 1}): warning #177-D: variable "i" was declared but never referenced',
        f'tests/fixtures/broken_kernel.cu({line}): error: identifier "undeclared_scale_factor" is undefined',
        f"{outside}(2): error: identifier \"c\" is undefined",
        "tests/fixtures/broken_kernel.cu(9999): error: past the end",
        "1 error detected in the compilation of \"x\".",
    ])
    found = build.diagnostics(log)
    assert [d["kind"] for d in found] == ["error", "error", "error"]  # errors only, when there are errors
    assert found[0] == {"path": "tests/fixtures/broken_kernel.cu", "line": line, "kind": "error",
                        "msg": 'identifier "undeclared_scale_factor" is undefined', "source": text}
    assert found[1]["path"] == str(outside.resolve()) and found[1]["source"] == "int b = c;"
    assert found[2]["source"] == ""
    warnings_only = build.diagnostics(log.splitlines()[0])
    assert len(warnings_only) == 1 and warnings_only[0]["kind"] == "warning"
    assert warnings_only[0]["msg"] == 'variable "i" was declared but never referenced'


def test_build_error_rendering_limits_and_log_fallback():
    diags = [{"path": "k.cu", "line": i, "kind": "error", "msg": f"m{i}", "source": ""} for i in range(1, 11)]
    message = str(build.BuildError("summary", diags, "log"))
    assert message.splitlines()[0] == "summary"
    assert "k.cu:8: error: m8" in message and "k.cu:9:" not in message
    assert message.splitlines()[-1].strip() == "... 2 more"
    log = "\n".join(f"line {i}" for i in range(20))
    fallback = str(build.BuildError("nvcc crashed", [], log)).splitlines()
    assert fallback[0] == "nvcc crashed" and fallback[1:] == [f"  line {i}" for i in range(8, 20)]


# ------------------------------------------------------------------ ptxas report on real nvcc output

@pytest.fixture(scope="module")
def probe_log(tmp_path_factory):
    out = tmp_path_factory.mktemp("ptxas") / "probe.o"
    log, _ = build.run_nvcc([*build.BASE_FLAGS, *build.check_arch_flags("sm_80"), *build.check_arch_flags("sm_90a"),
                             "-c", paths.relative(FIXTURES / "ptxas_probe.cu"), "-o", str(out)], "ptxas probe")
    return log


@requires_nvcc
def test_parse_ptxas_on_real_output(probe_log):
    rows = build.parse_ptxas(probe_log)
    by = {(r["kernel"], r["arch"]): r for r in rows}
    names = {"plain_kernel", "caller"}
    if shutil.which("c++filt"):
        names.add("void scale_kernel<3>(float*, float const*, float)")
    for arch in ("sm_80", "sm_90a"):
        for name in names:
            assert (name, arch) in by, f"{name} for {arch} missing from {sorted(by)}"
    assert len(rows) == 6  # 3 entries x 2 archs; the device function `helper` is not an entry
    for row in rows:
        assert 0 < row["registers"] <= 255
        assert row["spills"] is False and row["spill_stores"] == row["spill_loads"] == 0
    scale = [r for r in rows if "scale_kernel" in r["kernel"]]
    assert len(scale) == 2 and all(r["smem_bytes"] == 1024 for r in scale)  # __shared__ float buf[256]
    assert all(by[("plain_kernel", arch)]["smem_bytes"] == 0 for arch in ("sm_80", "sm_90a"))


@requires_nvcc
def test_parse_ptxas_keeps_the_entrys_stack_frame_when_a_device_function_follows(probe_log):
    # ptxas prints the non-inlined helper's "Function properties" block (0 bytes stack frame) after
    # `caller`'s; the entry's own stack frame must not be overwritten by the helper's.
    own = re.search(r"Function properties for caller\n\s*(\d+) bytes stack frame", probe_log)
    assert own, probe_log
    for row in build.parse_ptxas(probe_log):
        if row["kernel"] == "caller":
            assert row["stack_bytes"] == int(own.group(1)) > 0


@requires_nvcc
def test_parse_ptxas_flags_spills_on_real_output(tmp_path):
    log, _ = build.run_nvcc([*build.BASE_FLAGS, *build.check_arch_flags("sm_80"), *build.check_arch_flags("sm_90a"),
                             "-maxrregcount=16", "-c", paths.relative(FIXTURES / "spill_probe.cu"),
                             "-o", str(tmp_path / "spill.o")], "spill probe")
    rows = build.parse_ptxas(log)
    assert {r["arch"] for r in rows} == {"sm_80", "sm_90a"}
    for row in rows:
        assert row["kernel"] == "spill_kernel"
        assert row["spills"] is True
        assert row["spill_stores"] > 0 and row["spill_loads"] > 0 and row["stack_bytes"] > 0
        assert row["registers"] <= 32
    table = build.resource_table(rows)
    assert table.count("<-- SPILLS") == 2


def test_parse_ptxas_ignores_text_before_the_first_entry():
    log = ("ptxas info    : 0 bytes gmem\n"
           "ptxas info    : Function properties for _Z6helperv\n"
           "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n")
    assert build.parse_ptxas(log) == []


# ------------------------------------------------------------------ the kernel library cache

@requires_nvcc
def test_build_kernel_caches_by_key(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(build, "_loaded", {})
    source = FIXTURES / "launcher_probe.cu"
    arch = build.check_arch_flags("sm_80")
    first = build.build_kernel(source, arch=arch)
    assert first.cached is False and first.build_seconds > 0
    assert first.path.exists() and first.path.parent == tmp_path / "cache" / "kernels"
    assert first.source == "tests/fixtures/launcher_probe.cu"
    assert len(first.resources) == 1 and first.resources[0]["kernel"].startswith("probe_kernel")
    assert first.resources[0]["arch"] == "sm_80"
    meta = json.loads(first.path.with_suffix(".json").read_text())
    assert meta["resources"] == first.resources and "-gencode=arch=compute_80,code=sm_80" in meta["flags"]
    assert build.build_kernel(source, arch=arch) is first  # in-process memo
    monkeypatch.setattr(build, "_loaded", {})
    again = build.build_kernel(source, arch=arch)  # a new process: loaded from disk, no nvcc
    assert again.cached is True and again.key == first.key and again.path == first.path
    assert again.resources == first.resources
    other = build.build_kernel(source, defines={"LAB_PROBE_VALUE": "2.0f"}, arch=arch)
    assert other.cached is False and other.key != first.key and other.path != first.path
    assert again.address("probe_launch")  # dlopen works without a GPU (cudart loads the driver lazily)
    with pytest.raises(build.BuildError, match="exports no launcher named 'no_such_launcher'"):
        again.address("no_such_launcher")


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """(a copy of the launcher probe in a fresh kernel cache, the nvcc argument lists run since, nvcc uncounted)."""
    monkeypatch.setattr(paths, "CACHE", tmp_path / "cache")
    source = tmp_path / "probe.cu"
    source.write_text((FIXTURES / "launcher_probe.cu").read_text())
    calls = []
    real = build.run_nvcc

    def counting(args, what, *usage):
        calls.append(args)
        return real(args, what, *usage)

    monkeypatch.setattr(build, "run_nvcc", counting)
    return source, calls, real


@requires_nvcc
def test_compile_check_reuses_its_report_until_sources_or_flags_change(probe):
    source, calls, _ = probe
    first = build.compile_check(archs=("sm_80",), sources=[source])
    assert len(calls) == 1 and len(first) == 1 and first[0]["kernel"].startswith("probe_kernel")
    assert first[0]["source"] == str(source.resolve()) and first[0]["arch"] == "sm_80"
    assert build.compile_check(archs=("sm_80",), sources=[source]) == first and len(calls) == 1  # cached
    build.compile_check(archs=("sm_80",), sources=[source], defines={"LAB_PROBE_VALUE": "3.0f"})
    assert len(calls) == 2  # a define is part of the key
    source.write_text(source.read_text() + "\n// edited\n")
    build.compile_check(archs=("sm_80",), sources=[source])
    assert len(calls) == 3  # so is the source


@requires_nvcc
def test_compile_costs_are_nvccs_cpu_seconds_kept_with_the_cubin(probe, tmp_path, capsys, monkeypatch):
    """A compile-check target keeps what nvcc cost (its CPU seconds, cicc's and ptxas's among them, and its wall
    seconds) beside the cubin; a target not built has none; the CLI prints them costliest first with the sums."""
    source, calls, _ = probe
    other = tmp_path / "other.cu"
    other.write_text(source.read_text().replace("probe_kernel", "other_kernel"))
    assert [r["cpu_s"] for r in build.compile_costs(("sm_80",), [source])] == [None]  # not built yet
    build.compile_check(archs=("sm_80",), sources=[source])
    (cost,) = build.compile_costs(("sm_80",), [source])
    assert cost["source"] == str(source.resolve()) and cost["arch"] == "sm_80"
    assert 0 < cost["cpu_s"] <= cost["wall_s"] * 1.05 + 0.05  # nvcc runs its tools one after another
    build.compile_check(archs=("sm_80",), sources=[source])
    assert build.compile_costs(("sm_80",), [source]) == [cost] and len(calls) == 1  # a cached target keeps its cost
    rows = build.compile_costs(("sm_80",), [source, other])
    assert rows[1]["cpu_s"] is None
    table = build.cost_table(rows)
    assert f"{cost['cpu_s']:>7.1f}" in table.splitlines()[2] and "1 of 2 targets" in table.splitlines()[-1]
    assert table.splitlines()[-2].split()[-1] == f"{cost['cpu_s']:.1f}"  # the sum for sm_80

    from lab.__main__ import main
    monkeypatch.setattr(build, "kernel_sources", lambda: [source])
    assert main(["compile", "--arch", "sm_80", "--cost"]) == 0
    out = capsys.readouterr().out
    assert "probe_kernel" in out and f"{cost['cpu_s']:>7.1f}" in out and "1 of 1 targets" in out


@requires_nvcc
def test_run_nvcc_tells_apart_the_cpu_of_builds_that_run_at_once(tmp_path):
    """Two nvcc runs at once in threads of one process each get their own CPU seconds (wait4 on the child), not the
    sum of every child the process reaped: `nvcc --version` costs next to nothing beside a real compile."""
    from concurrent.futures import ThreadPoolExecutor

    compile_args = [*build.BASE_FLAGS, *build.check_arch_flags("sm_80"), "-cubin",
                    paths.relative(FIXTURES / "launcher_probe.cu"), "-o", str(tmp_path / "p.cubin")]
    usages = [{}, {}]
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(build.run_nvcc, compile_args, "probe", usages[0]),
                pool.submit(build.run_nvcc, ["--version"], "version", usages[1])]
        logs = [r.result()[0] for r in runs]
    assert "Cuda compilation tools" in logs[1]
    assert usages[0]["cpu_s"] > 0.1 and usages[1]["cpu_s"] < 0.5 * usages[0]["cpu_s"]
    assert all(0 < u["cpu_s"] <= u["wall_s"] * 1.05 + 0.05 for u in usages)


@requires_nvcc
def test_ptx_is_the_gates_own_and_a_switch_builds_its_own(probe, tmp_path):
    """build.ptx of a kernel without defines reads the PTX the gate's -cubin run kept (no second nvcc run), and it is
    what nvcc -ptx writes for the same flags; a define builds its own PTX once; a cached cubin whose PTX is gone gets
    its PTX built again."""
    source, calls, real = probe
    rows = build.compile_check(archs=("sm_80",), sources=[source])
    assert len(calls) == 1 and "--keep" in calls[0] and rows[0]["kernel"].startswith("probe_kernel")
    text = build.ptx(source, "sm_80")
    assert len(calls) == 1, "the gate's PTX is served from the cache"
    assert re.search(r"\.entry \w*probe_kernel", text) and "1065353216;" in text  # 1.0f's bits: the default
    direct = tmp_path / "direct.ptx"
    real([*build.BASE_FLAGS, *build.check_arch_flags("sm_80"), "-ptx", str(source), "-o", str(direct)], "probe PTX")
    assert direct.read_text() == text
    switched = build.ptx(source, "sm_80", {"LAB_PROBE_VALUE": "2.0f"})
    assert len(calls) == 2 and "-ptx" in calls[1] and "-DLAB_PROBE_VALUE=2.0f" in calls[1]
    assert "1073741824;" in switched and "1065353216;" not in switched and build.ptx_code(switched) != build.ptx_code(text)
    assert build.ptx(source, "sm_80", {"LAB_PROBE_VALUE": "2.0f"}) == switched and len(calls) == 2  # cached
    for kept in (tmp_path / "cache" / "compile_check").glob("probe-sm_80-*.ptx"):
        kept.unlink()
    assert build.ptx(source, "sm_80") == text and len(calls) == 3 and "-ptx" in calls[2]


@requires_nvcc
def test_ptx_of_a_broken_kernel_fails_as_the_gate_does():
    """The PTX path is no way around the gate: a kernel with an undeclared name fails it, with or without a define."""
    line, _ = marker_line(BROKEN, "BROKEN:")
    for defines in (None, {"LAB_BROKEN_SCALE": "3.0f"}):
        with pytest.raises(build.BuildError, match=rf"tests/fixtures/broken_kernel.cu:{line}: error: .*undeclared_scale_factor"):
            build.ptx(BROKEN, "sm_80", defines)


def test_ptx_code_leaves_out_the_line_table_only():
    text = (".visible .entry k(\n)\n{\n\t.loc\t1 12 3\n\tadd.s32 \t%r1, %r2, 1;\n\t.loc\t2 40 1\n\tret;\n}\n"
            "\t.file\t1 \"/x/k.cu\"\n\t.file\t2 \"/x/h.cuh\"\n\t.section\t.debug_str\n{\n$L__info_string0:\n}\n")
    code = build.ptx_code(text)
    assert code == ".visible .entry k(\n)\n{\n\tadd.s32 \t%r1, %r2, 1;\n\tret;\n}\n"
    assert build.ptx_code(code) == code  # PTX built without -lineinfo is left as it is
    assert build.ptx_code(code.replace("1;", "2;")) != code  # an instruction still counts


def test_cli_compile_exit_codes(monkeypatch, capsys):
    from lab.__main__ import main

    row = {"kernel": "k", "arch": "sm_80", "registers": 40, "smem_bytes": 0, "stack_bytes": 8,
           "spill_stores": 4, "spill_loads": 4, "spills": True, "source": "kernels/x.cu"}
    asked = []
    monkeypatch.setattr(build, "compile_check", lambda archs: asked.append(archs) or [row])
    assert main(["compile", "--arch", "sm_80"]) == 0
    assert asked == [("sm_80",)]
    out = capsys.readouterr().out
    assert "<-- SPILLS" in out and "1 kernel instantiations compiled; 1 spill" in out

    def broken(archs):
        raise build.BuildError("nvcc failed to build kernels/x.cu for sm_80")

    monkeypatch.setattr(build, "compile_check", broken)
    assert main(["compile"]) == 1
    assert "nvcc failed to build kernels/x.cu" in capsys.readouterr().err


# ------------------------------------------------------------------ the compile gate

# One test per kernel file, so pytest-xdist spreads the compile gate over its workers; each compiles its file for
# both check targets (in parallel) into the shared kernel cache, where the chapters' compile checks find it.
KERNEL_SOURCES = build.kernel_sources()


def test_kernels_folder_holds_the_kernels():
    assert KERNEL_SOURCES, "kernels/ has no .cu files"
    assert set(KERNEL_SOURCES) == set(build.kernel_sources())


@requires_nvcc
@pytest.mark.parametrize("source", KERNEL_SOURCES, ids=lambda p: p.relative_to(paths.KERNELS).as_posix())
def test_every_kernel_compiles_for_sm80_and_sm90a(source):
    """CI's compile gate: every kernels/**/*.cu must compile for both check targets. Never skip this.

    Each target is nvcc -cubin (build.compile_check): cicc checks the whole file, launchers included, and ptxas
    builds every instantiation, so an error anywhere in the kernel's code, any register or shared-memory limit
    ptxas enforces and every wgmma ptxas serializes show here as in the full build a GPU session makes. Only
    code under `#ifndef __CUDA_ARCH__` is seen by the host compiler alone: the next test keeps that to a list
    whose host code another test compiles."""
    try:
        rows = build.compile_check(build.CHECK_ARCHS, sources=[source])
    except build.BuildError as err:
        pytest.fail(f"compile gate:\n{err}", pytrace=False)
    print()
    print(build.resource_table(rows))
    print(f"{len(rows)} kernel instantiations; {sum(r['spills'] for r in rows)} spill")
    rel = paths.relative(source)
    for arch in build.CHECK_ARCHS:
        assert any(r["source"] == rel and r["arch"] == arch for r in rows), f"{rel} has no kernel for {arch}"
    for row in rows:
        assert row["arch"] in build.CHECK_ARCHS and row["registers"] > 0
    serialized = [f"{r['source']} {r['kernel']}: {r['wgmma_serialized']}" for r in rows if r["wgmma_serialized"]]
    assert not serialized, "ptxas serialized these kernels' wgmma instructions:\n" + "\n".join(serialized)


# Branches that only the host compiler sees (under `#ifndef __CUDA_ARCH__`, or the #else of `#ifdef __CUDA_ARCH__`)
# are not in the gate's device-only compile: each is listed here with the test that compiles it for the host.
HOST_ONLY_BRANCHES = {
    "kernels/common/paged.cuh": "tests/decode/test_paged_cursor.py (tests/fixtures/paged_cursor_check.cu, host code)",
}
_DIRECTIVE = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")


def host_only_branches(path: Path) -> list[int]:
    """Lines of `path` that open a branch only the host pass compiles: `#ifndef __CUDA_ARCH__`,
    `#if !defined(__CUDA_ARCH__)`, or an #else/#elif of `#ifdef __CUDA_ARCH__` / `#if defined(__CUDA_ARCH__) ...`."""
    found, stack = [], []  # stack: does the open conditional's first branch need __CUDA_ARCH__ defined?
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        m = _DIRECTIVE.match(line)
        if not m:
            continue
        word, rest = m.group(1), re.sub(r"\s+", "", m.group(2).split("//")[0])
        if word in ("if", "ifdef", "ifndef"):
            host = word == "ifndef" and rest == "__CUDA_ARCH__" or rest.startswith("!defined(__CUDA_ARCH__)")
            device = word == "ifdef" and rest == "__CUDA_ARCH__" or rest.startswith("defined(__CUDA_ARCH__)")
            if host:
                found.append(number)
            stack.append(device)
        elif word in ("else", "elif") and stack and stack[-1]:
            found.append(number)
        elif word == "endif" and stack:
            stack.pop()
    return found


def test_code_only_the_host_compiler_sees_is_compiled_elsewhere(tmp_path):
    closure = {path for source in KERNEL_SOURCES for path in build.source_closure(source)}
    found = {paths.relative(path): lines for path in sorted(closure) if (lines := host_only_branches(path))}
    unlisted = {path: lines for path, lines in found.items() if path not in HOST_ONLY_BRANCHES}
    assert not unlisted, (f"host-only branches the device-only compile gate does not compile: {unlisted}; compile "
                          "them in a host test and list them in HOST_ONLY_BRANCHES")
    assert set(found) == set(HOST_ONLY_BRANCHES), f"listed but gone: {set(HOST_ONLY_BRANCHES) - set(found)}"
    # the scanner itself, on each form
    probe = tmp_path / "probe.cuh"
    probe.write_text("#ifndef __CUDA_ARCH__\n#endif\n#if !defined(__CUDA_ARCH__) && 1\n#endif\n"
                     "#ifdef __CUDA_ARCH__\n#if X\n#else\n#endif\n#else\n#endif\n"
                     "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n#endif\n#if __CUDA_ARCH__ >= 900\n#else\n#endif\n")
    assert host_only_branches(probe) == [1, 3, 9]


def test_parse_ptxas_names_kernels_whose_wgmma_ptxas_serialized():
    """Real ptxas output (v07 at 93774e8 built with LAB_FWD_OVERLAP_D128_FUSE=1: a wgmma issued under a condition after
    its fence): the four persistent few-keys instantiations, the ones FUSE changes, carry C7520; the long-config
    ones built beside them do not."""
    rows = build.parse_ptxas((FIXTURES / "ptxas_wgmma_serialized.log").read_text())
    flagged = [r for r in rows if r["wgmma_serialized"]]
    assert len(rows) == 16 and len(flagged) == 4
    assert all(r["wgmma_serialized"].startswith("C7520: program dependence on compiler-inserted WG.AR in divergent")
               for r in flagged)
    few_keys = ("Cfg07<128, 128, 2, 3", "Cfg07ILi128ELi128ELi2ELi3E")  # demangled, or as is without c++filt
    long_cfg = ("Cfg07<128, 176", "Cfg07ILi128ELi176E")
    assert all(any(k in r["kernel"] for k in few_keys) for r in flagged)
    assert not any(any(k in r["kernel"] for k in long_cfg) for r in flagged)
    assert "<-- WGMMA SERIALIZED" in build.resource_table(rows)


def test_parse_ptxas_gives_a_serialized_wgmma_to_its_own_arch():
    """One nvcc run for sm_80 and sm_90a runs ptxas twice; the sm_90a run's warning, printed before that run's
    first entry, flags the sm_90a instantiation only."""
    entry = "ptxas info    : Compiling entry function '_Z1kv' for '{}'\nptxas info    : Used 40 registers\n"
    warning = ("ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized "
               "due to a reason in the function '_Z1kv'\n")
    rows = build.parse_ptxas(entry.format("sm_80") + warning + entry.format("sm_90a"))
    assert [(r["arch"], r["wgmma_serialized"]) for r in rows] == [("sm_80", None), ("sm_90a", "C7520: a reason")]


@requires_nvcc
def test_v04_sweep_switch_builds_one_tile_and_rejects_a_bad_one():
    """v04's one sweep switch (LAB_FWD_LAZY_TILE, commas escaped for nvcc) builds the tile it names through the
    same define path sweeps use; a tile that breaks FwdConfig's static checks fails to compile, loudly."""
    v04 = paths.KERNELS / "fwd" / "v04_lazy.cu"
    rows = build.compile_check(archs=("sm_80",), sources=[v04],
                               defines={"LAB_FWD_LAZY_TILE": r"FwdConfig<128\,8\,1\,64\,2\,1\,true\,false\,false\,1\,false>"})
    assert len(rows) == 2 and all(r["registers"] > 0 for r in rows)  # the one tile, fp16 and bf16
    assert all("FwdConfig<128, 8, 1, 64, 2, 1, true, false, false, 1, false," in r["kernel"] for r in rows)
    with pytest.raises(build.BuildError, match="v04_lazy.cu"):  # 3 warps: the Q tile load does not split evenly
        build.compile_check(archs=("sm_80",), sources=[v04], defines={"LAB_FWD_LAZY_TILE": r"FwdConfig<128\,3\,2\,64\,2\,2>"})


def test_ptx_entries_cut_each_kernel_from_its_own_entry():
    text = (".version 9.0\n\t// .globl\tfirst\n.visible .entry first(\n)\n{\n\tret;\n}\n\t// .globl\tsecond\n"
            ".visible .entry second(\n)\n{\n\tadd.s32 %r1, %r2, 1;\n}\n.entry internal(\n)\n{\n\tret;\n}\n")
    entries = build.ptx_entries(text)
    assert list(entries) == ["first", "second", "internal"]
    assert entries["first"] == ".visible .entry first(\n)\n{\n\tret;\n}\n"  # no marker of the next kernel
    assert "add.s32" in entries["second"] and "add.s32" not in entries["internal"]
