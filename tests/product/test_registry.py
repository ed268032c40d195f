"""lab.registry: the kernel tables and default rules, readable without torch, driving scripts and gates."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lab import registry


def test_the_registry_imports_without_torch():
    code = "import sys, lab.registry, lab.gates; assert 'torch' not in sys.modules, sorted(sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_ops_reexports_the_registry_tables():
    from lab import ops
    assert ops.FWD is registry.FWD and ops.DECODE is registry.DECODE
    assert ops.default_attention_version is registry.default_attention_version


def test_choose_matches_the_defaults_snapshot():
    """Every default is pinned once, in tests/fixtures/defaults.json; a deliberate change of a default regenerates it:
    .venv/bin/python -m lab.registry defaults > tests/fixtures/defaults.json (and the diff is the review)."""
    snapshot = json.loads((ROOT / "tests/fixtures/defaults.json").read_text())
    assert snapshot == registry.defaults_snapshot()
    assert len(snapshot) > 300 and {row["family"] for row in snapshot} == set(registry.TABLES)
    # the wrappers that callers use agree with choose on every cell
    for row in snapshot:
        shape, capability = row["shape"], tuple(row["capability"])
        if row["family"] == "fwd" and "version" in row:
            assert registry.default_attention_version(shape["head_dim"], shape["seqlen_q"], shape["causal"],
                                                      capability) == row["version"]
        if row["family"] == "decode" and shape.get("paged"):
            assert registry.default_paged_version(shape["heads_kv"], shape["head_dim"]) == row["version"]
        elif row["family"] == "decode":
            assert registry.default_decode_version(8, shape["heads_kv"], 1, shape["head_dim"]) == row["version"]


def test_default_versions_are_the_snapshot_variants():
    """default_versions (the sanitizer's list) is the set of versions the snapshot's cells reach, per GPU."""
    snapshot = json.loads((ROOT / "tests/fixtures/defaults.json").read_text())
    for capability in ((8, 0), (9, 0)):
        reached = {f: {r["version"] for r in snapshot if r["family"] == f and tuple(r["capability"]) == capability
                       and "version" in r} for f in ("fwd", "bwd", "decode")}
        assert registry.default_versions(capability)["fwd"] == reached["fwd"]
        assert registry.default_versions(capability)["bwd"] <= reached["bwd"]  # the narrow one (v20) has no driver


def test_every_version_is_a_variant_or_history():
    """A family's table is its product variants plus its history, never both, and every variant's file exists."""
    for family, table in registry.TABLES.items():
        product = {v.version for v in registry.VARIANTS.values() if v.family == family}
        history = set(registry.HISTORY[family])
        assert product | history == set(table) and not product & history, family
    for name, variant in registry.VARIANTS.items():
        assert name == variant.name and name.split("_")[0] == variant.family.split("_")[0]
        assert (ROOT / "kernels" / registry.kernel_of(variant).source).exists()
        assert variant.arch == ("sm_90a" if registry.kernel_of(variant).capabilities else "sm_80"), name
        assert registry.variant_of(variant.family, variant.version) is variant
    reached = {row["variant"] for row in registry.defaults_snapshot()}
    assert set(registry.VARIANTS) <= reached  # no variant in the table that no call reaches


def test_driver_rows_name_existing_files_and_the_kernel_symbol():
    rows = registry.drivers()
    wide = {f"{family}_{v}" for family, table in (("fwd", registry.FWD), ("decode", registry.DECODE), ("bwd", registry.BWD))
            for v, k in table.items() if not set(k.head_dims) & set(registry.FAST_HEAD_DIMS)}
    # sanitized through the public calls, not the drivers, whose D is 64/128
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
    def chosen(family, capability=(9, 0), **shape):
        return registry.choose(family, shape, capability).version

    fwd = {"case": {"D": 64, "Sq": 512, "causal": False}, "env": {"capability": "9.0"}}
    assert registry.default_for_row(fwd) == chosen("fwd", head_dim=64, seqlen_q=512, causal=False)
    assert registry.default_for_row({**fwd, "env": {"capability": "8.9"}}) == chosen("fwd", (8, 9), head_dim=64,
                                                                                        seqlen_q=512)
    assert registry.default_for_row({"case": {"Hq": 32, "Hkv": 8, "q_len": 1}}) == chosen("decode", heads_kv=8)
    assert registry.default_for_row({"case": {"Hq": 32, "Hkv": 8, "q_len": 1, "D": 80}}) == chosen("decode", head_dim=80)
    paged = {"case": {"Hq": 32, "Hkv": 8, "q_len": 1, "page_size": 16, "B": 128}, "env": {"sms": 132}}
    for case in ({**paged["case"], "D": 96}, {**paged["case"], "D": 192}, {**paged["case"], "Hkv": 2}):
        assert registry.default_for_row({"case": case}) == chosen("decode", head_dim=case.get("D", 128), heads_kv=case["Hkv"],
                                                                  paged=True)  # batch and SM count read by none
    assert registry.default_for_row(paged) == registry.default_for_row({**paged, "case": {**paged["case"], "B": 64}})
    assert registry.default_for_row({"case": {"D": 64, "Sq": 4}}) is None  # no GPU: no default
    assert registry.default_for_row({}) is None
