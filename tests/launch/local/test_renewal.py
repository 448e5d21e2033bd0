"""Workers have what the caller has imported (forkserver.renew): a module imported after the
launcher, in a notebook or a script, is in every rank's ``sys.modules`` when the function
starts, because the forkserver is a fork of the caller made after that import (the zygote,
renewed); the replaced one and its idle workers serve no launch, and end once their children
have. Where CUDA is in use in the caller, no fork of it is made (test_warm_up.py's fallback).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests import kernelspec
from tests.launch.helpers import ends

# A module no one imports by the time the launcher is, written by each test.
_MODULE = "imported_after_the_launcher"

_PROBE = textwrap.dedent(f"""
    import json, os, sys
    from multiprocessing import forkserver

    def server():
        return forkserver._forkserver._forkserver_pid

    def probe():
        import os, sys
        return {_MODULE!r} in sys.modules, os.getppid()

    def report(**seen):
        print(json.dumps(seen), flush=True)
""")


def _module(folder: Path) -> None:
    (folder / f"{_MODULE}.py").write_text("VALUE = 1\n")


def _run(command: list[str], cwd: Path) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if k != "NOTEBOOK_ACCEL_NO_WARMUP"}
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, env=environ, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    [line] = done.stdout.splitlines()  # nothing else printed
    seen: dict[str, Any] = json.loads(line)
    return seen


def test_a_module_imported_after_the_launcher_is_in_the_workers(tmp_path: Path) -> None:
    # A notebook-like caller (`python -c`): the zygote made when the launcher was imported
    # has no such module; the launch after the import forks this process again.
    _module(tmp_path)
    code = _PROBE + textwrap.dedent(f"""
        import torch
        from notebook_accel import notebook_launcher
        from notebook_accel.launch.local import forkserver as warm
        from notebook_accel.launch.local.idle import idle_pool
        warm._early.join()
        first = notebook_launcher(probe, num_processes=2, output="none")
        idle_pool.settle()  # idle workers of this zygote wait for the next launch
        old, idle = server(), sorted(idle_pool.pids())
        sys.path.insert(0, {str(tmp_path)!r})
        import {_MODULE}
        second = notebook_launcher(probe, num_processes=2, output="none")
        new = server()
        third = notebook_launcher(probe, num_processes=2, output="none")
        report(first=first, second=second, third=third, old=old, new=new, idle=idle,
               fork=open(f"/proc/{{new}}/cmdline").read() == open("/proc/self/cmdline").read())
    """)
    seen = _run([sys.executable, "-c", code], tmp_path)
    assert seen["first"] == [[False, seen["old"]]] * 2
    assert seen["new"] != seen["old"] and seen["fork"]
    # Every rank has it at start, and none ran on an idle worker of the replaced zygote.
    assert seen["second"] == [[True, seen["new"]]] * 2
    assert seen["third"] == [[True, seen["new"]]] * 2
    assert len(seen["idle"]) == 2 and not set(seen["idle"]) & {p for _, p in seen["second"]}
    # The replaced zygote ended once its children had (the third launch saw none left).
    assert ends(seen["old"], within=0.0) or ends(seen["old"])
    for pid in seen["idle"]:
        assert ends(pid)


def test_a_module_a_script_imported_before_its_launch_is_in_the_workers(
    tmp_path: Path,
) -> None:
    # `python train.py`: nothing starts when the launcher is imported; the launch forks the
    # script (with everything it imported by then) as the forkserver.
    _module(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(
        _PROBE
        + textwrap.dedent(f"""
            import torch
            from notebook_accel import notebook_launcher
            from notebook_accel.launch.local import forkserver as warm
            import {_MODULE}
            early = warm._early is None and server() is None
            out = notebook_launcher(probe, num_processes=2, output="none")
            fork = open(f"/proc/{{server()}}/cmdline").read() == open("/proc/self/cmdline").read()
            report(out=out, early=early, server=server(), fork=fork)
        """)
    )
    seen = _run([sys.executable, str(script)], tmp_path)
    assert seen["early"]  # the import of the launcher started nothing
    assert seen["fork"]
    assert seen["out"] == [[True, seen["server"]]] * 2
    assert ends(seen["server"])  # gone with the script


def test_in_a_real_kernel_a_cell_s_imports_reach_the_next_launch(tmp_path: Path) -> None:
    # The cell that imported the module renews the zygote as it ends (IPython's
    # post_run_cell), so the launch in the next cell finds it (and its idle workers) ready.
    _module(tmp_path)
    with kernelspec.selected(tmp_path / "jupyter"):
        cells = kernelspec.run_cells(
            [
                _PROBE,
                "import torch\nfrom notebook_accel import notebook_launcher",
                "from notebook_accel.launch.local import forkserver as warm\n"
                "warm._early.join()\n"
                "before = notebook_launcher(probe, num_processes=2, output='none')\n"
                "old = server()\n"
                "(before, old)",
                f"sys.path.insert(0, {str(tmp_path)!r})\nimport {_MODULE}",
                "renewed = server()\n"
                "after = notebook_launcher(probe, num_processes=2, output='none')\n"
                "(renewed, after, server())",
            ],
            timeout=lambda cell: 120,
        )
    before, old = ast.literal_eval(_text(cells[2]))
    renewed, after, current = ast.literal_eval(_text(cells[4]))
    assert before == [(False, old)] * 2
    assert renewed != old  # renewed at the end of the import's cell, before this one ran
    assert current == renewed
    assert after == [(True, renewed)] * 2
    assert ends(old) and ends(renewed)  # the kernel was shut down: nothing left


def _text(cell: Any) -> str:
    errors = [o for o in cell.outputs if o["output_type"] == "error"]
    assert not errors, "\n".join(errors[0]["traceback"])
    [result] = [o for o in cell.outputs if o["output_type"] == "execute_result"]
    return str(result["data"]["text/plain"])


def test_openmp_used_here_before_the_fork_does_not_stall_the_workers(tmp_path: Path) -> None:
    # This process ran OpenMP parallel regions (torch's matmul, 2 threads), then imported a
    # module: the launch forks it again. A fork made by the thread that ran them would have
    # a dead thread pool, and the workers' first parallel matmul would wait forever (the
    # launch's timeout= turns that into an error here rather than a hung test).
    _module(tmp_path)
    code = _PROBE + textwrap.dedent(f"""
        import torch
        from notebook_accel import notebook_launcher
        torch.set_num_threads(2)
        a = torch.randn(512, 512)
        for _ in range(3):
            a @ a
        sys.path.insert(0, {str(tmp_path)!r})
        import {_MODULE}

        def work():
            import os, torch
            torch.set_num_threads(2)
            x = torch.randn(512, 512)
            return (x @ x).shape[0], os.getppid()

        out = notebook_launcher(work, num_processes=2, output="none", timeout=120)
        report(out=out, server=server(), threads=torch.get_num_threads())
    """)
    seen = _run([sys.executable, "-c", code], tmp_path)
    assert seen["out"] == [[512, seen["server"]]] * 2
    assert seen["threads"] == 2  # this process's own pool is untouched


def test_an_accelerator_built_here_is_not_the_workers(tmp_path: Path) -> None:
    # This process built an Accelerator (ours, and accelerate's: a Borg whose facts live in
    # class-level dicts) before the fork: each rank is a new process in a new job.
    pytest.importorskip("accelerate")
    _module(tmp_path)
    code = _PROBE + textwrap.dedent(f"""
        import torch
        import accelerate, accelerate.state
        import notebook_accel.state
        from notebook_accel import Accelerator, notebook_launcher
        Accelerator(cpu=True)
        accelerate.Accelerator(cpu=True)
        here = notebook_accel.state.is_initialized(), accelerate.state.is_initialized()
        sys.path.insert(0, {str(tmp_path)!r})
        import {_MODULE}

        def work():
            import accelerate.state, notebook_accel.state
            return notebook_accel.state.is_initialized(), accelerate.state.is_initialized()

        out = notebook_launcher(work, num_processes=2, output="none")
        report(here=here, out=out)
    """)
    seen = _run([sys.executable, "-c", code], tmp_path)
    assert seen["here"] == [True, True]
    assert seen["out"] == [[False, False]] * 2
