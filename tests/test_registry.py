"""lab.registry: the kernel tables and default rules, readable without torch, driving scripts and gates."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab import registry


def test_the_registry_imports_without_torch():
    code = "import sys, lab.registry, lab.gates; assert 'torch' not in sys.modules, sorted(sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_ops_reexports_the_registry_tables():
    from lab import ops
    assert ops.FWD is registry.FWD and ops.DECODE is registry.DECODE
    assert ops.default_attention_version is registry.default_attention_version


def test_defaults_per_gpu_follow_the_hopper_preference():
    assert registry.default_attention_version(128, 8192, False, (8, 0)) == "v04"
    assert registry.default_attention_version(128, 8192, False, (9, 0)) == "v07"
    assert registry.default_attention_version(128, 512, True, (9, 0)) == "v07"  # few-keys config in PAIR order
    assert registry.default_attention_version(128, 512, False, (9, 0)) == "v07"
    assert registry.default_attention_version(64, 512, False, (9, 0)) == "v05"
    assert registry.default_attention_version(64, 2048, False, (9, 0)) == "v07"
    assert registry.default_attention_version(64, 2048, True, (9, 0)) == "v05"
    assert registry.default_attention_version(64, 8192, True, (9, 0)) == "v07"
    assert registry.default_attention_version(32, 100, False, (9, 0)) == "v01"  # only v01 has D=32
    assert registry.default_versions((9, 0)) == {"fwd": {"v01", "v05", "v07", "v10"}, "decode": {"v02", "v03", "v07", "v08"},
                                                 "bwd": {"v14", "v18", "v19", "v09"}}  # v18: the deterministic mode
    assert registry.default_versions((8, 0))["fwd"] == {"v01", "v04"}
    assert registry.default_versions((8, 0))["bwd"] == {"v01", "v09"}  # v09: head dims 192, 256


def test_driver_rows_name_existing_files_and_the_kernel_symbol():
    rows = registry.drivers()
    wide = {f"{family}_{v}" for family, table in (("fwd", registry.FWD), ("decode", registry.DECODE), ("bwd", registry.BWD))
            for v, k in table.items() if not set(k.head_dims) & set(registry.FAST_HEAD_DIMS)}
    # own sanitizer calls (tools/gpu/wide_sanitize.py; decode v08: tools/gpu/paged_warpring.py): the drivers' D is 64/128
    assert wide == {"fwd_v10", "decode_v08", "bwd_v09", "bwd_v19"}
    assert {r[0] for r in rows} == ({f"fwd_{v}" for v in registry.FWD} | {f"decode_{v}" for v in registry.DECODE} |
                                    {f"bwd_{v}" for v in registry.BWD}) - wide
    for name, main, source, define in rows:
        assert (ROOT / main).exists() and (ROOT / source).exists(), (name, main, source)
        family, version = name.split("_")
        table = {"fwd": registry.FWD, "decode": registry.DECODE, "bwd": registry.BWD}[family]
        one_mode = " -DBWD_MODES=1" if family == "bwd" and version not in registry.DETERMINISTIC_BWD else ""
        assert define == ("" if (family, version) in registry.OWN_DRIVER else f"-D{registry.DRIVERS[family][1]}="
                          f"{table[version].symbol}{one_mode}")
    hopper_only = {r[0] for r in registry.drivers((8, 0))}
    assert "fwd_v05" not in hopper_only and "fwd_v04" in hopper_only  # sm_90a kernels only where they run


def test_the_command_line_prints_tab_separated_rows_for_scripts():
    out = subprocess.run([sys.executable, "-m", "lab.registry", "drivers", "9.0", "--defaults"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    names = [line.split("\t")[0] for line in out]
    assert names == ["fwd_v01", "fwd_v05", "fwd_v07", "decode_v02", "decode_v03", "decode_v07",
                     "bwd_v14", "bwd_v18"]
    assert all(len(line.split("\t")) == 4 for line in out)
    bad = subprocess.run([sys.executable, "-m", "lab.registry"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_default_for_row_reads_shape_and_gpu_from_a_record():
    fwd = {"case": {"D": 64, "Sq": 512, "causal": False}, "env": {"capability": "9.0"}}
    assert registry.default_for_row(fwd) == "v05"
    assert registry.default_for_row({**fwd, "env": {"capability": "8.9"}}) == "v04"
    assert registry.default_for_row({"case": {"Hq": 32, "Hkv": 8, "q_len": 1}}) == "v07"
    assert registry.default_for_row({"case": {"Hq": 32, "Hkv": 8, "q_len": 1, "D": 80}}) == "v08"  # v07: D 64 / 128
    assert registry.default_for_row({"case": {"Hq": 8, "Hkv": 8, "q_len": 1, "page_size": 16}}) == "v07"  # no batch
    assert registry.default_for_row({"case": {"Hq": 8, "Hkv": 8, "q_len": 1, "page_size": 16, "D": 96}}) == "v08"
    paged = {"case": {"Hq": 32, "Hkv": 8, "q_len": 1, "page_size": 16, "B": 128}, "env": {"sms": 132}}
    assert registry.default_for_row(paged) == "v07"  # 128 blocks of 8 heads fill the wave: v07 all the same
    assert registry.default_for_row({**paged, "case": {**paged["case"], "B": 64}}) == "v07"
    assert registry.default_for_row({**paged, "case": {**paged["case"], "D": 192}}) == "v03"  # v04, v07, v08: D 64-128
    assert registry.default_for_row({"case": {"Hq": 8, "Hkv": 2, "q_len": 1, "page_size": 16}}) == "v07"
    assert registry.default_for_row({"case": {"D": 64, "Sq": 4}}) is None  # no GPU: no default
    assert registry.default_for_row({}) is None
