"""Environment check ("Pattern 9"): what is installed, what kernels will be built for, and what is wrong.

Every problem comes with a one-line fix. The fingerprint travels with every recorded result.
Runs in well under 5 s: no compilation, one `nvcc --version` and one `nvidia-smi` query.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from . import build, paths
from .build import nvcc_version  # the compiler's version belongs to the build (its cache key)


@dataclass
class EnvReport:
    facts: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)  # (problem, fix)

    @property
    def ok(self) -> bool:
        return not self.problems

    def table(self) -> str:
        width = max(len(k) for k in self.facts)
        lines = [f"{k:<{width}}  {v}" for k, v in self.facts.items()]
        if self.problems:
            lines.append("")
            lines += [f"PROBLEM: {p}\n    fix: {fix}" for p, fix in self.problems]
        else:
            lines.append("\nno problems found")
        return "\n".join(lines)


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def driver_version() -> str | None:
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.strip().splitlines()[0] if out and out.strip() else None


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def gpu_info() -> dict | None:
    """Name, compute capability, SMs and memory of the current GPU, or None without CUDA."""
    torch = _torch()
    if torch is None or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_mib": round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
    }


def fingerprint() -> dict:
    """The environment that goes with every result: GPU, driver, CUDA, torch, nvcc, Python."""
    torch = _torch()
    gpu = gpu_info()
    return {
        "gpu": gpu["name"] if gpu else "cpu",
        "capability": gpu["capability"] if gpu else None,
        "sms": gpu["sms"] if gpu else None,
        "driver": driver_version() if gpu else None,
        "cuda": getattr(torch.version, "cuda", None) if torch else None,
        "torch": torch.__version__ if torch else None,
        "nvcc": nvcc_version(),
        "python": platform.python_version(),
        "host": platform.node(),
    }



def ninja_path() -> str | None:
    """The ninja this Python's environment installed (beside the interpreter: .venv/bin/ninja, the version
    requirements.txt pins) before any other on PATH; the Makefile puts .venv/bin first on PATH, so torch's
    load_inline runs that one too."""
    beside = os.path.join(os.path.dirname(sys.executable), "ninja")
    return beside if os.access(beside, os.X_OK) else shutil.which("ninja")

def check() -> EnvReport:
    report = EnvReport()
    facts, problems = report.facts, report.problems
    facts["python"] = f"{platform.python_version()} ({sys.executable})"
    torch = _torch()
    if torch is None:
        facts["torch"] = "not installed"
        problems.append(("torch is not installed", "pip install torch==2.13.0  (or run `make book`, which installs it)"))
    else:
        facts["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda or 'none: CPU-only build'})"
    nvcc = nvcc_version()
    facts["nvcc"] = f"{nvcc} ({shutil.which('nvcc')})" if nvcc else "not found"
    if not nvcc:
        problems.append(("nvcc not found", "install the CUDA toolkit and put its bin/ on PATH (export PATH=/usr/local/cuda/bin:$PATH)"))
    where = ninja_path()
    ninja = _run([where or "ninja", "--version"])
    facts["ninja"] = f"{ninja.strip()} ({where})" if ninja else "not found"
    if not ninja:
        problems.append(("ninja not found (torch's load_inline needs it)", "pip install ninja==1.13.2"))
    gpu = gpu_info()
    if gpu:
        facts["gpu"] = f"{gpu['name']}, sm_{gpu['capability'].replace('.', '')}, {gpu['sms']} SMs, {gpu['memory_gib']} GiB, L2 {gpu['l2_mib']} MiB"
        facts["driver"] = driver_version() or "unknown"
        try:
            facts["kernel arch flags"] = " ".join(build.arch_flags(tuple(int(x) for x in gpu["capability"].split("."))))
        except build.BuildError as err:
            problems.append((str(err), "run on an Ampere (sm_80) or newer GPU"))
    else:
        facts["gpu"] = "none: CPU mode (kernels are compile-checked, not run)"
        facts["kernel arch flags"] = "compile check: " + ", ".join(build.CHECK_ARCHS)
        if torch is not None and torch.version.cuda is None:
            facts["note"] = "CPU-only torch: load_inline cannot build CUDA code here; chapters run in CPU mode"
    if torch is not None and torch.version.cuda and nvcc:
        same_major = torch.version.cuda.split(".")[0] == nvcc.split(".")[0]
        facts["torch CUDA vs nvcc"] = f"{torch.version.cuda} vs {nvcc}: " + ("major versions agree" if same_major else "MISMATCH")
        if not same_major:
            problems.append((f"torch was built for CUDA {torch.version.cuda} but nvcc is {nvcc}",
                             "install a torch wheel for your nvcc's CUDA major, or put the matching nvcc first on PATH"))
    paths.setup_cache_env()
    ext_dir = os.environ["TORCH_EXTENSIONS_DIR"]
    writable = _writable(ext_dir)
    facts["extension dir"] = f"{ext_dir} ({'writable' if writable else 'NOT writable'})"
    if not writable:
        problems.append((f"{ext_dir} is not writable", "export TORCH_EXTENSIONS_DIR=/tmp/torch_extensions"))
    return report


def _writable(directory: str) -> bool:
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            return True
    except OSError:
        return False
