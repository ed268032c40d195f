"""One notebook through papermill, as a session and an experiment run it (lab.session, lab.launch).

- only the parameters the notebook's parameters cell declares are passed (papermill warns of any other);
- any failure, in a cell or of the kernel itself, comes back as a described result, never an exception;
- the kernel's sockets are encrypted where pyzmq and the kernel spec allow it;
- the executed notebook names its input and output as a reader can use them: the notebook is committed and
  published, and papermill writes the running machine's absolute paths into its metadata.
"""
from __future__ import annotations

import re
import traceback as tb
from pathlib import Path

from . import files, paths

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def short_traceback(lines) -> str:
    """The last 40 lines of a traceback (at most 4,000 characters), without the terminal's colour codes."""
    text = _ANSI.sub("", "\n".join(lines) if isinstance(lines, list) else str(lines))
    return "\n".join(text.splitlines()[-40:])[-4000:]


def _declared(papermill, source: Path, parameters: dict) -> dict:
    """The parameters the notebook's parameters cell names (all of them if it cannot be inspected)."""
    try:
        declared = papermill.inspect_notebook(str(source))
    except Exception:  # no kernelspec, no parameters cell: papermill itself reports what is wrong
        return parameters
    return {name: value for name, value in parameters.items() if name in declared} if declared else parameters


def _reader_path(value: str, anchors: tuple[Path, ...]) -> str:
    """`value` relative to the first anchor folder that holds it; otherwise machine paths scrubbed
    (lab.publish.clean.scrub), and a path still absolute (a root the scrubber does not know) shown from its
    parent folder on."""
    from .publish.clean import scrub

    path = Path(value)
    if not path.is_absolute():
        return value
    for anchor in anchors:
        try:
            return path.resolve().relative_to(anchor.resolve()).as_posix()
        except (ValueError, OSError):
            continue
    text = scrub(value)
    return text if not text.startswith("/") else "…/" + "/".join(path.parts[-2:])


def relative_paths(target: Path, cwd: Path | None = None) -> None:
    """The executed notebook's papermill metadata names its input and output by the absolute paths of the machine
    that ran it; a session folder is committed and published, so they are rewritten as a reader can use them: the
    input relative to the checkout (`chapters/n4_baseline.ipynb`), the output from the outputs folder on
    (`outputs/sessions/<id>/n4_baseline.ipynb`), whatever folder the checkout sits in. Nothing else is touched."""
    import nbformat  # with papermill

    target = Path(target)
    outputs_parent = target.resolve().parents[3] if len(target.resolve().parents) > 3 else target.parent
    anchors = {"input_path": tuple(a for a in (paths.ROOT, cwd) if a is not None),
               "output_path": (outputs_parent,)}
    try:
        nb = nbformat.read(str(target), as_version=nbformat.NO_CONVERT)
        meta = nb.metadata.get("papermill", {})
        changed = {key: _reader_path(meta[key], anchors[key]) for key in anchors if isinstance(meta.get(key), str)}
        if any(meta[key] != value for key, value in changed.items()):
            meta.update(changed)
            files.write_atomic(target, nbformat.writes(nb) + "\n")
    except (OSError, ValueError):  # no notebook (papermill failed before its first save), or none writable: the
        pass  # chapter's own status stands, and the paths stay as papermill wrote them


def kernel_manager_class():
    """The kernel manager papermill starts each chapter's kernel with: where pyzmq has CurveZMQ and the kernel's
    spec declares it (ipykernel 7 does), the manager provisions its keys, so the kernel's sockets are encrypted and
    the kernel does not print its "running over TCP without encryption" warning at every chapter; elsewhere
    jupyter_client's default, unencrypted as before."""
    import zmq
    from jupyter_client.manager import AsyncKernelManager

    if not zmq.has("curve") or "transport_encryption" not in AsyncKernelManager.class_trait_names():
        return AsyncKernelManager

    class EncryptedKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            kwargs.setdefault("transport_encryption", "auto")
            super().__init__(**kwargs)

    return EncryptedKernelManager


def execute(source: Path, target: Path, parameters: dict, cwd: Path, timeout: float | None) -> dict:
    """Run one notebook; returns {status, error, traceback}. Any failure is caught and described."""
    import papermill  # slow import, needed only here

    try:
        # only the parameters the chapter's parameters cell declares: the session's `cases` means nothing to a
        # chapter without one (papermill would warn "Passed unknown parameter")
        parameters = _declared(papermill, source, parameters)
        papermill.execute_notebook(str(source), str(target), parameters=parameters, kernel_name="python3",
                                   cwd=str(cwd), progress_bar=False, execution_timeout=timeout,
                                   kernel_manager_class=kernel_manager_class())
        return {"status": "ok", "error": None, "traceback": None}
    except papermill.PapermillExecutionError as err:
        return {"status": "failed", "error": f"{err.ename}: {err.evalue}"[:500],
                "exception": err.ename, "traceback": short_traceback(err.traceback)}
    except Exception as err:  # dead kernel, timeout, bad notebook: still a recorded failure
        return {"status": "failed", "error": f"{type(err).__name__}: {err}"[:500],
                "exception": type(err).__name__, "traceback": short_traceback(tb.format_exc())}
    finally:  # whatever papermill saved, a partial notebook included
        relative_paths(target, cwd)
