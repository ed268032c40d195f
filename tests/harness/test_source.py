"""lab.source: kernel excerpts by marker comments."""
import pytest

from lab import ops, source


def _kernel(tmp_path, text):
    (tmp_path / "k.cu").write_text(text)
    return tmp_path


def test_excerpt_returns_the_marked_lines_with_numbers(tmp_path):
    root = _kernel(tmp_path, "a\n// [lab:loop] the loop\nx += 1;\ny += x;\n// [/lab:loop]\nb\n")
    first, body, note = source.excerpt("k.cu", "loop", root)
    assert (first, body, note) == (3, ["x += 1;", "y += x;"], "the loop")
    md = source.markdown("k.cu", "loop", root)
    assert "lines 3-4: the loop" in md and "```cuda\nx += 1;\ny += x;\n```" in md


@pytest.mark.parametrize("text", ["// [lab:loop]\nx\n", "x\n// [/lab:loop]\n", "// [/lab:loop]\n// [lab:loop]\n",
                                  "// [lab:loop]\n// [/lab:loop]\n// [lab:loop]\n// [/lab:loop]\n"])
def test_missing_or_repeated_markers_raise(tmp_path, text):
    with pytest.raises(source.MarkerError, match="expected one"):
        source.excerpt("k.cu", "loop", _kernel(tmp_path, text))



def test_chapter_kernels_carry_their_markers():
    """Every default kernel a chapter shows has its inner loop marked (the chapter cuts it from the file)."""
    for table, version in ((ops.FWD, "v04"), (ops.DECODE, "v02")):
        assert "inner-loop" in source.markers(table[version].source)
