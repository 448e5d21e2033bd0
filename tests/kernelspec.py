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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def install(folder: Path) -> dict[str, str]:
    """Write the spec under ``folder``; returns the environment variables that select it."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p)
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
