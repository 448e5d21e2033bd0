"""A Jupyter kernel spec for the tests: this interpreter, with this checkout importable.

Notebooks name the kernel ``python3``. A ``python3`` spec placed first on ``JUPYTER_PATH``
makes nbclient and Voilà start *this* interpreter (the test's virtual environment) with the
repository on ``PYTHONPATH``, whether or not the package was installed, and without touching
the user's Jupyter folders.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def install(folder: Path, root: Path = ROOT) -> dict[str, str]:
    """Write the spec under ``folder``; returns the environment variables that select it.

    ``root``: the checkout the kernel imports (benchmarks compare another commit's)."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(root)) if p)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (notebook_accel tests)",
                "language": "python",
                "env": {"PYTHONPATH": path},
            }
        )
    )
    jupyter_path = os.pathsep.join(
        p for p in (str(folder), os.environ.get("JUPYTER_PATH", "")) if p
    )
    return {"JUPYTER_PATH": jupyter_path, "PYTHONPATH": path}


@contextmanager
def selected(folder: Path, root: Path = ROOT) -> Iterator[None]:
    """The spec installed under ``folder`` selected for a block; the old variables after."""
    values = install(folder, root)
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_cells(sources: list[str], timeout: Callable[[Any], int], path: Path = ROOT) -> list[Any]:
    """Run ``sources`` as a notebook's cells on a real kernel, errors kept as outputs.

    ``timeout(cell)``: seconds after which nbclient interrupts the cell (the stop button).
    Returns the cells as a saved notebook would have them.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=180,
        allow_errors=True,
        interrupt_on_timeout=True,
        timeout_func=timeout,
        resources={"metadata": {"path": str(path)}},
    ).execute()
    return list(nbformat.reads(nbformat.writes(notebook), as_version=4).cells)


class Kernel:
    """A kernel driven message by message (jupyter_client), every iopub message kept in order."""

    def __init__(self) -> None:
        from jupyter_client.manager import KernelManager

        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(ROOT))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self.messages: list[dict[str, Any]] = []

    def run(self, code: str, timeout: float = 120) -> str:
        """Execute ``code``; returns the request's id once its reply and idle status came."""
        msg_id = self.client.execute(code)
        reply = self.client.get_shell_msg(timeout=timeout)
        assert reply["content"]["status"] == "ok", reply["content"]
        self.until(
            lambda m: (
                m["content"].get("execution_state") == "idle"
                and m["parent_header"].get("msg_id") == msg_id
            ),
            timeout,
        )
        return str(msg_id)

    def until(self, seen: Callable[[dict[str, Any]], bool], timeout: float = 120) -> None:
        """Keep iopub messages until one for which ``seen`` is true (an event, not a delay)."""
        while True:
            message = self.client.get_iopub_msg(timeout=timeout)
            self.messages.append(message)
            if seen(message):
                return

    def printed(self, msg_id: str) -> str:
        """What request ``msg_id`` printed (its stream messages)."""
        return "".join(
            m["content"]["text"]
            for m in self.messages
            if m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == msg_id
        )
