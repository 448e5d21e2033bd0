"""Importing the package, or reaching the launcher, does not import torch (a notebook's
first launch starts the forkserver's torch import before the parent needs its own)."""

from __future__ import annotations

import subprocess
import sys


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, notebook_accel\n"
        "from notebook_accel import notebook_launcher, debug_launcher, LaunchConfig\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
