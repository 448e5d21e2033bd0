"""The GPU suite's wiring, checked where there is no GPU: every test under tests/cuda carries
the ``cuda`` marker (so ``pytest -m cuda`` selects it) and, without a GPU, a skip with a reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cuda.conftest import visible_gpus

ROOT = Path(__file__).resolve().parents[1]


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_every_gpu_test_is_marked_cuda_and_skips_without_a_gpu() -> None:
    if visible_gpus():  # a GPU machine: `pytest -m cuda` runs them; check the marking only
        unmarked = _pytest("--collect-only", "-q", "-m", "not cuda", "tests/cuda")
        assert unmarked.returncode == 5, unmarked.stdout  # 5: nothing lacks the marker
        return
    run = _pytest("-q", "-rs", "-m", "cuda", "tests/cuda")
    assert run.returncode == 0, run.stdout + run.stderr
    summary = run.stdout.strip().splitlines()[-1]
    # Nothing deselected by `-m cuda` (every test is marked), nothing run (no GPU), no error.
    assert "skipped" in summary, summary
    assert not any(word in summary for word in ("deselected", "passed", "failed", "error"))
    assert int(summary.split()[0]) >= 10
    assert "no CUDA GPU visible (run `pytest -m cuda` on a GPU machine)" in run.stdout
