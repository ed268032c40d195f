"""The kernel READMEs' version tables are the ones lab.publish.readme_tables generates from lab.registry."""
import pytest

from lab import registry
from lab.publish import readme_tables


@pytest.mark.parametrize("family", sorted(readme_tables.README))
def test_readme_table_is_generated(family):
    text = (readme_tables.ROOT / readme_tables.README[family]).read_text()
    assert readme_tables.block(text) == readme_tables.version_table(family), "run `python -m lab readme`"


@pytest.mark.parametrize("family,table", [("fwd", registry.FWD), ("decode", registry.DECODE), ("bwd", registry.BWD)])
def test_every_registered_version_has_a_row_and_an_idea(family, table):
    rows = readme_tables.version_table(family).splitlines()[2:]
    names = [row.split(" | ")[0].lstrip("| ") for row in rows]
    assert [n for n in names if not n.startswith("masked")] == sorted(table)
    assert all(row.split(" | ")[2] != "-" for row in rows)
    assert all((family, name) in readme_tables.IDEAS for name in names)


def _status(family: str, version: str) -> str:
    row = [r for r in readme_tables.version_table(family).splitlines() if r.startswith(f"| {version} |")][0]
    return row.split(" | ")[4]


def test_status_follows_the_registry(monkeypatch):
    assert _status("decode", "v01") == "history"
    assert _status("decode", "v07") == "**default**: `decode_swizzled_ring`"
    monkeypatch.setitem(registry.HISTORY, "decode", registry.HISTORY["decode"] + ("v07",))
    assert _status("decode", "v07") == "history"


def test_block_needs_markers():
    with pytest.raises(ValueError):
        readme_tables.block("no table here")
