"""The README's demo, run as a user runs it: it trains, and the terminal shows no warning."""

from __future__ import annotations

import subprocess
import sys


def test_demo_trains_and_leaves_no_resource_tracker_warning() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "notebook_accel.demo", "--epochs", "2"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert "on 2 processes" in done.stdout
    # The workers leave with os._exit; a semaphore they held (tqdm's lock) used to stay
    # registered and the resource tracker reported it as leaked at exit.
    assert "resource_tracker" not in done.stderr, done.stderr
    assert "leaked" not in done.stderr, done.stderr


def test_a_killed_worker_s_tqdm_lock_is_not_reported_at_exit() -> None:
    code = (
        "from notebook_accel import debug_launcher\n"
        "def f():\n"
        "    import os, tqdm\n"
        "    for _ in tqdm.tqdm(range(2)): pass\n"
        "    if os.environ['RANK'] == '1': raise ValueError('stop')\n"
        "    import time; time.sleep(60)\n"
        "try:\n"
        "    debug_launcher(f, num_processes=2, output='none')\n"
        "except ValueError:\n"
        "    print('raised')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert "raised" in done.stdout, done.stderr
    assert "resource_tracker" not in done.stderr, done.stderr
