"""Build recipe: plain-CUDA kernels compiled by nvcc into small shared libraries, one torch binding.

Why this shape (the origin lost 60-180 minutes a session to builds):
- kernels/ has no torch headers, so a kernel edit recompiles one .cu file in seconds;
  `half` vs `c10::Half` and template instantiation across units cannot happen: each
  kernel file is one compilation unit that exports `extern "C"` launchers.
- the torch binding (lab/binding.cpp) is compiled once per torch version by load_inline
  and calls any launcher through a function pointer taken from the kernel's library.
- every binary is cached under a key of everything that changes it; a cached load is a dlopen.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from . import cache_files, files, paths

CHECK_ARCHS = ("sm_80", "sm_90a")
BASE_FLAGS = ("-std=c++17", "-O3", "-lineinfo", "-Xptxas", "-v", "-I", "kernels")
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
_NVCC_DIAG = re.compile(r"^(?P<path>[^\s()][^()]*)\((?P<line>\d+)\): (?P<kind>error|warning|catastrophic error)[^:]*: (?P<msg>.*)$")


class BuildError(RuntimeError):
    """A kernel failed to build. str() is compact: each error as path:line: message, with the source line."""

    def __init__(self, summary: str, diagnostics: list | None = None, log: str = ""):
        self.summary = summary
        self.diagnostics = diagnostics or []
        self.log = log
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [self.summary]
        for diag in self.diagnostics[:8]:
            lines.append(f"  {diag['path']}:{diag['line']}: {diag['kind']}: {diag['msg']}")
            if diag.get("source"):
                lines.append(f"      | {diag['source']}")
        if len(self.diagnostics) > 8:
            lines.append(f"  ... {len(self.diagnostics) - 8} more")
        if not self.diagnostics and self.log:
            lines += ["  " + line for line in self.log.strip().splitlines()[-12:]]
        return "\n".join(lines)


# ---------------------------------------------------------------- arch selection

def arch_flags(capability: tuple[int, int]) -> list[str]:
    """nvcc target flags for a device's compute capability.

    Hopper gets sm_90a so that wgmma/setmaxnreg can be used (guarded by __CUDA_ARCH_FEAT_SM90_ALL);
    Ada gets sm_89; other Ampere parts run sm_80 code; newer parts get their own target.
    """
    major, minor = capability
    if major < 8:
        raise BuildError(f"unsupported GPU: compute capability {major}.{minor}; the lab's kernels need sm_80 (Ampere) or newer")
    if (major, minor) == (9, 0):
        return ["-gencode=arch=compute_90a,code=sm_90a"]
    if (major, minor) == (8, 9):
        return ["-gencode=arch=compute_89,code=sm_89"]
    if major == 8:
        return ["-gencode=arch=compute_80,code=sm_80"]
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


def check_arch_flags(arch: str) -> list[str]:
    """Flags for a named compile-check target such as 'sm_80' or 'sm_90a'."""
    number = arch.removeprefix("sm_")
    return [f"-gencode=arch=compute_{number},code={arch}"]


def device_arch_flags() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        raise BuildError("no CUDA device: " + (
            "this torch is a CPU-only build (torch.version.cuda is None); install a CUDA build of torch to run kernels"
            if torch.version.cuda is None else "torch sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)"))
    return arch_flags(torch.cuda.get_device_capability())


# ---------------------------------------------------------------- cache key

def source_closure(source: Path) -> list[Path]:
    """The .cu file and every local header it includes, recursively (search: its folder, then kernels/)."""
    seen: list[Path] = []
    stack = [Path(source).resolve()]
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen.append(path)
        for name in _INCLUDE.findall(path.read_text()):
            for folder in (path.parent, paths.KERNELS):
                candidate = (folder / name).resolve()
                if candidate.exists():
                    stack.append(candidate)
                    break
    return seen


def cache_key(source: Path, flags: list[str], extra: dict | None = None) -> str:
    """Hash of the sources (with included headers), the flags (arch and -D defines among them) and extras."""
    digest = hashlib.sha256()
    for path in sorted(source_closure(source)):
        digest.update(paths.relative(path).encode())
        digest.update(path.read_bytes())
    digest.update(json.dumps({"flags": list(flags), "extra": extra or {}, "nvcc": nvcc_version()},
                             sort_keys=True).encode())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def nvcc_version() -> str | None:
    """nvcc's release ('12.8') or None; part of every cache key: a new nvcc must not reuse old binaries."""
    try:
        out = subprocess.run([shutil.which("nvcc") or "nvcc", "--version"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def source_hash(source: Path | str) -> str:
    """Hash of a kernel's sources alone (recorded with every result)."""
    return cache_key(_kernel_path(source), [])


# ---------------------------------------------------------------- ptxas report

# ptxas's "(C75xx) Potential Performance Loss: wgmma.mma_async instructions are serialized due to <why> in the
# function '<name>'": it then waits for each wgmma before the next, and the kernel runs at a fraction of its rate
# (v07's FUSE: -15 %, outputs/driver_logs/20261123-h200-v07-fuse-run14-*). Printed before the entry's block.
WGMMA_SERIALIZED = re.compile(r"\((C75\d\d)\) Potential Performance Loss: wgmma\S* instructions are serialized "
                              r"due to (.*?) in the function '([^']+)'")


def parse_ptxas(text: str) -> list[dict]:
    """Per-kernel resources from `-Xptxas -v` output: registers, smem, stack frame, spills, and whether ptxas
    serialized the kernel's wgmma instructions (wgmma_serialized: "C7520: <why>", or None)."""
    rows, current, props_for = [], None, None
    # ptxas prints a run's C75xx warnings before that run's first entry; one nvcc run for several archs runs
    # ptxas once per arch, so a warning belongs to the arch of the next entry
    serialized, pending = {}, {}
    for line in text.splitlines():
        if m := WGMMA_SERIALIZED.search(line):
            pending[m.group(3)] = f"{m.group(1)}: {m.group(2)}"
        elif m := re.search(r"Compiling entry function '([^']+)' for '(\w+)'", line):
            serialized.update({(name, m.group(2)): why for name, why in pending.items()})
            pending = {}
            current = {"kernel": m.group(1), "arch": m.group(2), "registers": 0, "smem_bytes": 0,
                       "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0}
            rows.append(current)
            props_for = None
        elif current is None:
            continue
        elif m := re.search(r"Function properties for (\S+)", line):
            props_for = m.group(1)  # a non-inlined device function's block must not overwrite the entry's
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            if props_for not in (None, current["kernel"]):
                continue
            current["stack_bytes"], current["spill_stores"], current["spill_loads"] = map(int, m.groups())
        elif m := re.search(r"Used (\d+) registers", line):
            current["registers"] = int(m.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                current["smem_bytes"] = int(s.group(1))
    names = _demangle([row["kernel"] for row in rows])
    for row in rows:
        row["wgmma_serialized"] = serialized.get((row["kernel"], row["arch"]))
        row["kernel"] = names[row["kernel"]]
        row["spills"] = row["spill_stores"] + row["spill_loads"] > 0
    return rows


def _demangle(names: list[str]) -> dict[str, str]:
    """Each mangled name with its demangled form, from one c++filt run for all of them (a log of every kernel
    holds some 1600 entries: a process each cost seconds). Mangled names hold no whitespace, so c++filt, reading
    them one a line on stdin, answers one line each, in order; a name it cannot demangle comes back as it is."""
    unique = list(dict.fromkeys(names))
    tool = shutil.which("c++filt")
    if not tool or not unique:
        return {name: name for name in unique}
    lines = subprocess.run([tool], input="\n".join(unique) + "\n", capture_output=True, text=True).stdout.splitlines()
    if len(lines) != len(unique):  # never seen; keep the names as they are rather than pair them wrongly
        return {name: name for name in unique}
    return {name: (out.strip() or name).replace("(anonymous namespace)::", "") for name, out in zip(unique, lines)}


def resource_table(rows: list[dict]) -> str:
    width = max([len(r["kernel"]) for r in rows] + [6])
    header = f"{'kernel':<{width}} {'arch':<7} {'regs':>4} {'smem':>7} {'stack':>5} {'spill st/ld':>11}"
    lines = [header, "-" * len(header)]
    for r in rows:
        flag = ("  <-- SPILLS" if r["spills"] else "") + ("  <-- WGMMA SERIALIZED" if r.get("wgmma_serialized") else "")
        lines.append(f"{r['kernel']:<{width}} {r['arch']:<7} {r['registers']:>4} {r['smem_bytes']:>7} "
                     f"{r['stack_bytes']:>5} {r['spill_stores']:>5}/{r['spill_loads']:<5}{flag}")
    return "\n".join(lines)


# ---------------------------------------------------------------- compile

def _nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BuildError("nvcc not found: install the CUDA toolkit and put its bin/ on PATH "
                         "(export PATH=/usr/local/cuda/bin:$PATH)")
    return nvcc


def _kernel_path(source: Path | str) -> Path:
    path = Path(source)
    if not path.is_absolute():
        path = paths.KERNELS / path if not str(path).startswith("kernels/") else paths.ROOT / path
    if not path.exists():
        raise BuildError(f"kernel source not found: {paths.relative(path)}")
    return path


def run_nvcc(args: list[str], what: str, usage: dict | None = None) -> tuple[str, float]:
    """Run nvcc from the repo root (so diagnostics name kernels/... paths); raise BuildError on failure.

    Each run has a temp folder of its own (TMPDIR), removed after it: a file that fails in nvcc's front end can
    leave an empty <file>-<hash>..lgenfe.bc behind, which would otherwise pile up in the system's temp folder.
    `usage`, when given, gets the run's wall seconds and the CPU seconds (user + system) of nvcc and every tool it
    ran (cicc, ptxas, ...: nvcc waits for each, so their time is in its own rusage), read with wait4 for this one
    child: builds that run at once in threads of one process are told apart."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lab-nvcc-") as scratch:
        with open(Path(scratch) / "out", "w+") as out, open(Path(scratch) / "err", "w+") as err:
            proc = subprocess.Popen([_nvcc(), *args], cwd=paths.ROOT, stdout=out, stderr=err,
                                    env={**os.environ, "TMPDIR": scratch})
            # this one child's rusage: getrusage's RUSAGE_CHILDREN would add up other threads' builds too
            _, raw, rusage = os.wait4(proc.pid, 0)
            proc.returncode = status = os.waitstatus_to_exitcode(raw)  # so Popen never waits for it again
            out.seek(0)
            err.seek(0)
            log = out.read() + err.read()
    seconds = time.perf_counter() - start
    if usage is not None:
        usage.update(wall_s=round(seconds, 3), cpu_s=round(rusage.ru_utime + rusage.ru_stime, 3))
    if status != 0:
        raise BuildError(f"nvcc failed to build {what}", diagnostics(log), log)
    return log, seconds


def diagnostics(log: str) -> list[dict]:
    """nvcc errors and warnings as {path, line, kind, msg, source}, paths relative to the repo."""
    found = []
    for raw in log.splitlines():
        m = _NVCC_DIAG.match(raw.strip())
        if not m:
            continue
        path = Path(m.group("path"))
        full = path if path.is_absolute() else paths.ROOT / path
        line = int(m.group("line"))
        source = ""
        if full.exists():
            lines = full.read_text().splitlines()
            source = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        found.append({"path": paths.relative(full), "line": line, "kind": m.group("kind"),
                      "msg": m.group("msg").strip(), "source": source})
    errors = [d for d in found if "error" in d["kind"]]
    return errors or found


_SWITCH = re.compile(r"^\s*#\s*ifndef\s+(LAB_\w+)", re.M)


def check_defines(source: Path | str, defines) -> None:
    """Every define a build is asked for must be a name its source or one of its headers reads: otherwise nvcc
    compiles the default unchanged and an A/B of the two compares a build with itself. ValueError names the
    define and the switches the file has (its `#ifndef LAB_...` defaults)."""
    if not defines:
        return
    names = list(defines) if isinstance(defines, dict) else [str(d).split("=")[0] for d in defines]
    texts = [p.read_text() for p in source_closure(_kernel_path(source))]
    unused = [n for n in names if not any(re.search(rf"\b{re.escape(n)}\b", t) for t in texts)]
    if unused:
        switches = sorted({m for t in texts for m in _SWITCH.findall(t)})
        raise ValueError(f"define {', '.join(map(repr, unused))}: neither {paths.relative(_kernel_path(source))} nor "
                         f"its headers read it, so the build would be the default's; its switches: "
                         f"{', '.join(switches) or 'none'}")


def _define_flags(defines: dict | list | tuple | None) -> list[str]:
    if not defines:
        return []
    if isinstance(defines, dict):
        return [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in sorted(defines.items())]
    return [f"-D{d}" for d in defines]


@dataclass
class KernelLibrary:
    source: str
    path: Path
    key: str
    cached: bool
    build_seconds: float
    resources: list = field(default_factory=list)
    _lib: ctypes.CDLL | None = None

    def address(self, symbol: str) -> int:
        """The launcher's address, passed to the binding as an int."""
        if self._lib is None:
            self._lib = ctypes.CDLL(str(self.path))
        try:
            return ctypes.cast(getattr(self._lib, symbol), ctypes.c_void_p).value
        except AttributeError:
            raise BuildError(f"{self.source} exports no launcher named {symbol!r} "
                             f"(is it declared extern \"C\"?)") from None


_loaded: dict[str, KernelLibrary] = {}


def build_kernel(source: Path | str, defines=None, arch: list[str] | None = None) -> KernelLibrary:
    """Compile one kernel file into a shared library (cached); returns it with its ptxas resource table."""
    path = _kernel_path(source)
    arch = arch if arch is not None else device_arch_flags()
    flags = [*BASE_FLAGS, *arch, *_define_flags(defines)]
    key = cache_key(path, flags)
    if key in _loaded:
        return _loaded[key]
    check_defines(path, defines)
    out_dir = paths.CACHE / "kernels"
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / f"{path.stem}-{key}.so"
    meta = so.with_suffix(".json")
    source = paths.relative(path)

    def ready() -> KernelLibrary | None:
        try:  # a library without readable metadata (a build killed between the two) is built again
            info = json.loads(meta.read_text()) if so.exists() else None
        except (OSError, ValueError):
            return None
        return KernelLibrary(source, so, key, True, 0.0, info["resources"]) if info else None

    def make(tmp: Path) -> KernelLibrary:
        log, seconds = run_nvcc([*flags, "-shared", "-Xcompiler", "-fPIC", source, "-o", str(tmp)], source)
        built = KernelLibrary(source, so, key, False, seconds, parse_ptxas(log))
        files.write_atomic(meta, json.dumps({"source": source, "flags": flags, "resources": built.resources,
                                             "build_seconds": seconds}, indent=1))
        return built

    lib = cache_files.publish_once(so, ready, make)
    _loaded[key] = lib
    return lib


def kernel_sources() -> list[Path]:
    """Every kernel file; dot-folders (kernels/.scratch, a chapter's edit playground) are not kernels."""
    return sorted(p for p in paths.KERNELS.rglob("*.cu")
                  if not any(part.startswith(".") for part in p.relative_to(paths.KERNELS).parts))


def compile_check(archs=CHECK_ARCHS, sources: list[Path] | None = None, defines=None) -> list[dict]:
    """Compile every kernel for each arch without a GPU (device code: a cubin per arch); return the resource rows.

    The nvcc runs go in parallel (one per core); results are cached by key. Raises BuildError naming
    the first kernel, in file order, that does not compile.

    Each run is nvcc -cubin: the preprocessor, cicc and ptxas, the same ptxas report as a full build. cicc's
    front end parses and type-checks the whole translation unit, the host launchers with it (it must: the
    kernel templates a launcher instantiates are found in host code), so an error in a launcher fails here as
    in a full build. What -c adds is the host compiler's pass over the same code (cudafe++ and g++: 0.4-9 s a
    file, 511 -> 417 CPU-seconds for the 41 kernel files' gate on a cold cache, 2026-11-29); the only code
    cicc does not see is under `#ifndef __CUDA_ARCH__`, which tests/product/test_build.py keeps to a list.
    """
    jobs = [(_kernel_path(path), arch) for path in (sources or kernel_sources()) for arch in archs]
    for path in dict.fromkeys(p for p, _ in jobs):
        check_defines(path, defines)
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        futures = [pool.submit(_check_one, path, arch, defines) for path, arch in jobs]
        logs = [f.result() for f in futures]  # re-raises the first failure in file order
    rows = []
    for (path, _), log in zip(jobs, logs):
        for row in parse_ptxas(log):
            row["source"] = paths.relative(path)
            rows.append(row)
    return rows


def _check_flags(arch: str, defines) -> list[str]:
    return [*BASE_FLAGS, *check_arch_flags(arch), *_define_flags(defines)]


def _ptx_path(path: Path, arch: str, flags: list[str]) -> Path:
    """Where the PTX of (file, arch, flags) is cached: one name whichever run wrote it (the gate's -cubin run
    keeps it, a -ptx run makes it); cicc writes the same PTX in both."""
    return paths.CACHE / "compile_check" / f"{path.stem}-{arch}-{cache_key(path, flags)}.ptx"


def _check_target(path: Path, arch: str, defines=None) -> Path:
    """The cached cubin of one compile-check target (file, arch, defines); its ptxas report and its cost lie beside
    it (.log, .cost.json)."""
    flags = _check_flags(arch, defines)
    return paths.CACHE / "compile_check" / f"{path.stem}-{arch}-{cache_key(path, [*flags, '-cubin'])}.cubin"


def _check_one(path: Path, arch: str, defines=None) -> str:
    """One compile-check target, cached: nvcc -cubin of one file for one arch; its ptxas report.

    The run keeps its intermediates (--keep, in a folder of its own that is removed after it) and moves the PTX
    that cicc handed to ptxas into the cache beside the cubin (PTX first, cubin last: a reader that sees the
    cubin sees its PTX). A test that reads a kernel's PTX (`ptx`) then costs no second cicc run; --keep
    changes no output (the cubin is the same byte for byte) and costs only the writes. The run's cost (nvcc's CPU
    and wall seconds) is kept too, for `compile_costs`."""
    out_dir = paths.CACHE / "compile_check"
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = _check_flags(arch, defines)
    obj = _check_target(path, arch, defines)
    saved = obj.with_suffix(".log")
    source = paths.relative(path)

    def ready() -> str | None:  # unchanged sources and flags: reuse the ptxas report
        return _cached_text(saved, obj)

    def make(tmp: Path) -> str:
        usage = {}
        with tempfile.TemporaryDirectory(prefix=".keep-", dir=out_dir) as keep:
            log, _ = run_nvcc([*flags, "-cubin", "--keep", "--keep-dir", keep, source, "-o", str(tmp)],
                              f"{source} for {arch}", usage)
            kept = list(Path(keep).glob("*.ptx"))
            if len(kept) == 1:  # one arch, one PTX; anything else is left to `ptx` to build on its own
                os.replace(kept[0], _ptx_path(path, arch, flags))
        files.write_atomic(obj.with_suffix(".cost.json"), json.dumps(usage))
        files.write_atomic(saved, log)
        return log

    return cache_files.publish_once(obj, ready, make)


def compile_costs(archs=CHECK_ARCHS, sources: list[Path] | None = None, defines=None) -> list[dict]:
    """What each compile-check target cost when nvcc built it: {source, arch, cpu_s, wall_s} per file and arch, in
    file order; cpu_s and wall_s are None for a target not in the cache (not checked yet) or cached before costs
    were kept. cpu_s is nvcc's and its tools' user + system time; wall_s depends on what else ran beside it."""
    rows = []
    for path in map(_kernel_path, sources or kernel_sources()):
        for arch in archs:
            cost = {"cpu_s": None, "wall_s": None}
            target = _check_target(path, arch, defines)
            try:
                if target.exists():
                    cost.update(json.loads(target.with_suffix(".cost.json").read_text()))
            except (OSError, ValueError):
                pass
            rows.append({"source": paths.relative(path), "arch": arch, **cost})
    return rows


def cost_table(rows: list[dict]) -> str:
    """compile_costs' rows, costliest first, with the sum for each arch and the whole: what a cold compile check
    asks of the CPU (its wall time on N cores is at least the sum / N)."""
    known = sorted((r for r in rows if r["cpu_s"] is not None), key=lambda r: -r["cpu_s"])
    width = max([len(r["source"]) for r in rows] + [6])
    lines = [f"{'source':<{width}} {'arch':<7} {'cpu s':>7} {'wall s':>7}"]
    lines.append("-" * len(lines[0]))
    lines += [f"{r['source']:<{width}} {r['arch']:<7} {r['cpu_s']:>7.1f} {r['wall_s']:>7.1f}" for r in known]
    archs = dict.fromkeys(r["arch"] for r in rows)
    for arch in archs:
        part = [r["cpu_s"] for r in known if r["arch"] == arch]
        lines.append(f"{'sum':<{width}} {arch:<7} {sum(part):>7.1f}")
    missing = len(rows) - len(known)
    lines.append(f"{'sum':<{width}} {'all':<7} {sum(r['cpu_s'] for r in known):>7.1f}  ({len(known)} of {len(rows)} "
                 f"targets{'; the others have no cost kept' if missing else ''})")
    return "\n".join(lines)


def _cached_text(text: Path, published: Path) -> str | None:
    """The cached text of a build whose last file written (`published`) exists, or None (not built, or unreadable:
    build it again)."""
    try:
        return text.read_text() if published.exists() else None
    except OSError:
        return None


def ptx(source: Path | str, arch: str = "sm_90a", defines=None) -> str:
    """The PTX of a kernel file for one check target, as cicc hands it to ptxas (the gate's flags, -lineinfo among
    them: compare two builds with `ptx_code`). Without defines it is the compile gate's own, kept beside the
    gate's cubin, so the gate and the tests that read the PTX share one cicc run; with defines (a switch under
    test) nvcc -ptx builds it once into the same cache."""
    path = _kernel_path(source)
    check_defines(path, defines)
    flags = _check_flags(arch, defines)
    target = _ptx_path(path, arch, flags)
    if not defines:
        _check_one(path, arch)  # the gate's target: built here if the gate has not reached it yet

    def ready() -> str | None:
        return _cached_text(target, target)

    def make(tmp: Path) -> str:  # a switch's build, or a gate cubin cached before its PTX was kept
        run_nvcc([*flags, "-ptx", paths.relative(path), "-o", str(tmp)], f"{paths.relative(path)} PTX for {arch}")
        return tmp.read_text()

    return cache_files.publish_once(target, ready, make)


def ptx_code(text: str) -> str:
    """PTX without what -lineinfo adds (the .loc lines, and the .file table and debug sections after the last
    entry, whose file numbers follow the order in which the whole module first used each header): what is left
    is the code, instruction for instruction, so one kernel's text compares equal across builds that changed
    other kernels."""
    text = re.sub(r"^[ \t]*\.loc\s.*\n", "", text, flags=re.M)
    tail = re.search(r"^[ \t]*\.(?:file|section)\s", text, flags=re.M)
    return text[:tail.start()] if tail else text


def ptx_entries(text: str) -> dict[str, str]:
    """{kernel entry name: its PTX, up to the next entry} of a module's PTX (`ptx`, or `ptx_code` of it); internal
    entries (no .visible) count too. The text is cut before each entry and before each `// .globl NAME` comment,
    which names the entry after it: left on the kernel before, it would make two builds' same code differ."""
    chunks = re.split(r"(?=^[ \t]*(?://[ \t]*\.globl\s|(?:\.visible\s+)?\.entry\s))", text, flags=re.M)
    return {m.group(1): chunk for chunk in chunks if (m := re.search(r"\.entry (\S+)\(", chunk))}


# ---------------------------------------------------------------- the torch binding

_binding = None


class Binding:
    """The compiled binding (lab/binding.cpp) with its error strings raised as RuntimeError.

    attn_fwd / decode_fwd return "" or the message of the first bad argument; no C++ exception crosses into
    Python (a TORCH_CHECK, or any c10::str formatting, in a load_inline module segfaulted the process on the
    H200 machine: see lab/binding.cpp).
    """

    __slots__ = ("module", "attn_fwd", "decode_fwd", "attn_call", "decode_call", "decode_paged_call", "attn_bwd_call")

    def __init__(self, module):
        self.module = module
        self.attn_fwd = _raising(module.attn_fwd)
        self.decode_fwd = _raising(module.decode_fwd)
        self.attn_call = _raising(module.attn_call)  # -> (out, lse or None)
        self.decode_call = _raising(module.decode_call)  # -> (out,)
        self.decode_paged_call = _raising(module.decode_paged_call)  # -> (out, page_errors)
        self.attn_bwd_call = _raising(module.attn_bwd_call)  # -> (dq, dk, dv)


def _raising(function):
    """A bound function that answers an error string, alone or ahead of its results: the error raised as
    RuntimeError, else the results (None for the functions that answer the string alone)."""
    def call(*args):
        answer = function(*args)
        error, results = (answer, None) if isinstance(answer, str) else (answer[0], answer[1:])
        if error:
            raise RuntimeError(error)
        return results
    return call


def binding():
    """The torch binding (lab/binding.cpp), built once per torch version and then imported from cache."""
    global _binding
    if _binding is not None:
        return _binding
    import torch  # here, not above: lab.build (the compile check, the CLI) loads without torch

    if torch.version.cuda is None:
        raise BuildError("this torch is a CPU-only build: torch.utils.cpp_extension cannot build CUDA code "
                         "(CUDA_HOME is None). Install a CUDA build of torch to run kernels; CPU mode still "
                         "compile-checks them with `python -m lab compile`.")
    if shutil.which("ninja") is None:
        raise BuildError("ninja not found: torch's load_inline needs it (pip install ninja==1.13.2)")
    paths.setup_cache_env()
    source = (Path(__file__).parent / "binding.cpp").read_text()
    header = (paths.KERNELS / "common" / "params.h").read_text()
    key = hashlib.sha256((source + header + torch.__version__).encode()).hexdigest()[:12]
    name = f"lab_binding_{key}"
    build_dir = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / name
    built = build_dir / f"{name}.so"
    module = None
    if not _binding_ready(built):
        build_dir.mkdir(parents=True, exist_ok=True)
        with cache_files.locked(built):  # torchrun's ranks on a cold cache: one builds, the others wait
            if not built.exists():
                from torch.utils.cpp_extension import load_inline

                module = load_inline(name=name, cpp_sources=[source], with_cuda=True,
                                     extra_include_paths=[str(paths.KERNELS)], extra_cflags=["-O2"],
                                     build_directory=str(build_dir), verbose=False)
    if module is None:  # a cached load is an import, never a ninja run
        spec = importlib.util.spec_from_file_location(name, built)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    _binding = Binding(module)
    return _binding


def _binding_ready(built: Path) -> bool:
    """The binding's library is whole: it exists and no builder holds its lock (ours, or torch's own baton,
    which ninja's link runs under), checked in that order so a library seen half-linked is never loaded."""
    return built.exists() and not built.with_name(built.name + ".lock").exists() \
        and not (built.parent / "lock").exists()
