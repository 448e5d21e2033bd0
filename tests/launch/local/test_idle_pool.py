"""Pre-forked workers (engine.idle_pool): after a launch, fresh processes wait for the next
one; a launch gets them (never a process that ran anything before), a dead one is passed
over, and they end with the notebook. Each test runs a notebook-like ``python -c`` (the
pool is for callers whose ``__main__`` has no file: under pytest it stays off)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.launch.helpers import ends

_LAUNCH = textwrap.dedent("""
    import json, os, select, signal, sys
    from notebook_accel import debug_launcher
    from notebook_accel.launch.local.idle import idle_pool

    def pids():
        import os
        return os.getpid()

    def report(**seen):
        print(json.dumps(seen), flush=True)
""")


def _run(code: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCH + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_the_next_launch_runs_on_the_fresh_pre_forked_workers() -> None:
    seen = _run("""
        first = debug_launcher(pids, num_processes=2)
        idle_pool.settle()
        waiting = sorted(idle_pool.pids())
        second = debug_launcher(pids, num_processes=2)
        idle_pool.settle()
        report(first=first, waiting=waiting, second=second, after=sorted(idle_pool.pids()))
    """)[0]
    assert len(seen["waiting"]) == 2
    assert sorted(seen["second"]) == seen["waiting"]  # the launch took the waiting ones
    assert not set(seen["second"]) & set(seen["first"])  # fresh: none ran the first launch
    assert len(seen["after"]) == 2 and not set(seen["after"]) & set(seen["second"])


def test_a_launch_passes_over_a_pre_forked_worker_that_died() -> None:
    seen = _run("""
        debug_launcher(pids, num_processes=2)
        idle_pool.settle()
        dead, alive = sorted(idle_pool.pids())
        watch = os.pidfd_open(dead)
        os.kill(dead, signal.SIGKILL)
        select.select([watch], [], [])  # it has ended
        ranks = debug_launcher(pids, num_processes=2)
        report(dead=dead, alive=alive, ranks=ranks)
    """)[0]
    assert seen["dead"] not in seen["ranks"]
    assert len(set(seen["ranks"])) == 2


def test_a_bigger_launch_takes_the_pre_forked_workers_and_forks_the_rest() -> None:
    seen = _run("""
        debug_launcher(pids, num_processes=2)
        idle_pool.settle()
        waiting = sorted(idle_pool.pids())
        ranks = debug_launcher(pids, num_processes=3)
        idle_pool.settle()
        report(waiting=waiting, ranks=ranks, after=len(idle_pool.pids()))
    """)[0]
    assert set(seen["waiting"]) <= set(seen["ranks"])
    assert len(set(seen["ranks"])) == 3
    assert seen["after"] == 3  # ready for the next launch of that size


def test_the_pre_forked_workers_end_with_the_notebook() -> None:
    seen = _run("""
        debug_launcher(pids, num_processes=2)
        idle_pool.settle()
        report(idle=sorted(idle_pool.pids()))
    """)[0]
    assert len(seen["idle"]) == 2
    for pid in seen["idle"]:
        assert ends(pid)


def test_a_script_with_a_file_gets_no_pre_forked_workers(tmp_path: object) -> None:
    from pathlib import Path

    script = Path(str(tmp_path)) / "train.py"
    script.write_text(
        _LAUNCH + "debug_launcher(pids, num_processes=2)\n"
        "idle_pool.settle()\nreport(idle=len(idle_pool.pids()))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"idle": 0}


def test_pre_forked_workers_get_the_launch_s_shared_memory_and_return_through_it() -> None:
    # Captured data over 1 MiB travels in memfd segments and results come back through the
    # launch's results segment: their fds reach a pre-forked worker with its launch.
    seen = _run("""
        import torch
        data = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB: out of band
        def use():
            import os, torch
            rank = float(os.environ["RANK"])
            return float(data.sum()), torch.full((1 << 19,), rank), os.getpid()
        debug_launcher(pids, num_processes=2)
        idle_pool.settle()
        waiting = sorted(idle_pool.pids())
        out = debug_launcher(use, num_processes=2)
        report(waiting=waiting, sums=[s for s, _, _ in out], ran=sorted(p for _, _, p in out),
               returned=[float(t.sum()) for _, t, _ in out], lengths=[len(t) for _, t, _ in out])
    """)[0]
    assert seen["ran"] == seen["waiting"]  # on the pre-forked workers
    expected = float(sum(range(1 << 20)))
    assert seen["sums"] == [expected, expected]
    assert seen["returned"] == [0.0, float(1 << 19)]
    assert seen["lengths"] == [1 << 19, 1 << 19]
