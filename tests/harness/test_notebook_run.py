"""lab/notebook_run.py: one notebook through papermill, as the session runner and the experiment launcher run it."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import nbformat
import pytest

from lab import notebook_run, paths

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("root", ["/check/work/main", "/srv/ci/lab", "/work/main"])
def test_papermill_paths_are_rewritten_whatever_folder_the_checkout_sits_in(tmp_path, monkeypatch, root):
    """CI clones the lab into folders the machine-path scrubber has never seen; the input is still named
    relative to the checkout and the output from the outputs folder on."""
    monkeypatch.setattr(paths, "ROOT", Path(root))
    target = tmp_path / "outputs" / "sessions" / "20261130-000000-cpu-abc" / "n4_baseline.ipynb"
    target.parent.mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.metadata["papermill"] = {"input_path": f"{root}/chapters/n4_baseline.ipynb", "output_path": str(target),
                                "duration": 1.0}
    target.write_text(nbformat.writes(nb))
    notebook_run.relative_paths(target)
    meta = json.loads(target.read_text())["metadata"]["papermill"]
    assert meta == {"input_path": "chapters/n4_baseline.ipynb",
                    "output_path": "outputs/sessions/20261130-000000-cpu-abc/n4_baseline.ipynb", "duration": 1.0}
    # an input outside the checkout keeps no machine root either
    nb.metadata["papermill"]["input_path"] = "/elsewhere/deep/folder/mine.ipynb"
    target.write_text(nbformat.writes(nb))
    notebook_run.relative_paths(target)
    assert json.loads(target.read_text())["metadata"]["papermill"]["input_path"] == "…/folder/mine.ipynb"


def test_a_chapter_gets_only_the_parameters_it_declares(tmp_path, monkeypatch):
    """The session's parameters (device, cases, ...) reach a chapter only where its parameters cell names them:
    papermill would otherwise print "Passed unknown parameter: cases" into the chapter."""
    import papermill

    chapter = tmp_path / "n99_device_only.ipynb"
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_markdown_cell("# Device only"),
                nbformat.v4.new_code_cell('device = "auto"', metadata={"tags": ["parameters"]})]
    nbformat.write(nb, chapter)
    seen = {}
    monkeypatch.setattr(papermill, "execute_notebook", lambda source, target, parameters, **kw: seen.update(parameters))
    result = notebook_run.execute(chapter, tmp_path / "out.ipynb", {"device": "cpu", "cases": "quick"}, tmp_path, None)
    assert result["status"] == "ok" and seen == {"device": "cpu"}, result
    notebook_run.execute(FIXTURES / "ok_chapter.ipynb", tmp_path / "ok.ipynb", {"device": "cpu", "cases": "full"},
                         tmp_path, None)
    assert seen == {"device": "cpu", "cases": "full"}  # a chapter that declares cases gets it


def test_chapter_kernels_run_with_encrypted_sockets_and_print_no_tcp_warning(tmp_path, capfd):
    """Each chapter's kernel gets CurveZMQ keys from its manager where pyzmq and the kernel spec allow it, so no
    session prints ipykernel's "running over TCP without encryption" warning once a chapter."""
    import zmq

    if not zmq.has("curve"):
        pytest.skip("this pyzmq has no CurveZMQ: the kernel runs unencrypted, as jupyter_client's default")
    manager = notebook_run.kernel_manager_class()
    assert manager(kernel_name="python3").transport_encryption == "auto"
    chapter = tmp_path / "plain.ipynb"
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell('device = "auto"', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("print('ran on', device)")]
    nbformat.write(nb, chapter)
    capfd.readouterr()
    result = notebook_run.execute(chapter, tmp_path / "out.ipynb", {"device": "cpu"}, tmp_path, None)
    err = capfd.readouterr().err
    assert result["status"] == "ok", result
    assert "ran on cpu" in (tmp_path / "out.ipynb").read_text()
    assert "without encryption" not in err, err
