"""The forkserver starts when the launcher is imported (forkserver.warm_up_early), printing
nothing, ending with the process that imported it, off with NOTEBOOK_ACCEL_NO_WARMUP=1: a
fork of the notebook (a zygote) where torch is imported and CUDA is not in use, else a
fresh interpreter started in the background, so that the notebook's CUDA state never
reaches the workers."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from typing import Any

from tests import kernelspec
from tests.launch.helpers import ends

# Imports the launcher, waits until the early start has happened, prints the server's pid.
_STARTED = (
    "import json, os, sys\n"
    "from notebook_accel import notebook_launcher\n"
    "from multiprocessing import forkserver\n"
    "from notebook_accel.launch.local import forkserver as warm\n"
    "thread = warm._early\n"
    "thread is not None and thread.join()\n"
    "print(json.dumps({'thread': thread is not None,"
    " 'server': forkserver._forkserver._forkserver_pid}))\n"
)


def _python(code: str, **extra: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "NOTEBOOK_ACCEL_NO_WARMUP"}
    environ.update(extra)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300
    )


def test_importing_the_launcher_starts_the_forkserver_silently_and_it_ends_with_us() -> None:
    done = _python(_STARTED)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    [line] = done.stdout.splitlines()  # nothing else printed
    seen = json.loads(line)
    assert seen["thread"] and seen["server"]
    # The interpreter exited while its forkserver may still be importing torch: it goes too.
    assert ends(seen["server"])


def test_the_switch_keeps_the_forkserver_from_starting_early() -> None:
    done = _python(_STARTED, NOTEBOOK_ACCEL_NO_WARMUP="1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"thread": False, "server": None}


def test_importing_the_package_alone_starts_nothing() -> None:
    code = (
        "import notebook_accel, notebook_accel.config\n"
        "from notebook_accel import LaunchConfig\n"
        "from multiprocessing import forkserver\n"
        "from notebook_accel.launch.local import forkserver as warm\n"
        "print(warm._early is None, forkserver._forkserver._forkserver_pid)"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "None"]


def _started_then(code: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs _STARTED, then ``code`` (which prints one JSON line): both lines, parsed."""
    done = _python(_STARTED + code)
    assert done.returncode == 0, done.stderr
    started, launched = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    return started, launched


def test_the_first_launch_forks_its_workers_from_the_server_started_early() -> None:
    # Torch is never imported here (only in the workers): the workers are the children of the
    # server the import started, a fresh interpreter, never forks of this process.
    code = (
        "def parent():\n"
        "    import os, torch\n"
        "    return os.getppid()\n"
        "parents = notebook_launcher(parent, num_processes=2, hardware='cpu', output='none')\n"
        "server = open(f'/proc/{parents[0]}/cmdline').read()\n"
        "print(json.dumps({'parents': parents, 'me': os.getpid(), 'server': server,"
        " 'torch': 'torch' in sys.modules}))\n"
    )
    started, launched = _started_then(code)
    assert launched["torch"] is False
    assert launched["parents"] == [started["server"]] * 2
    assert started["server"] != launched["me"]
    assert "from multiprocessing.forkserver import main" in launched["server"]  # a fresh one


def test_torch_imported_after_the_early_start_makes_the_launch_s_server_a_fork() -> None:
    # Torch imported (and used) here after the early start: the fresh server lacks what this
    # process has, so the launch forks this process as the forkserver (a zygote) and the
    # early one is retired, gone once its idle workers are.
    code = (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "parents = notebook_launcher(os.getppid, num_processes=2, hardware='cpu',"
        " output='none')\n"
        "server = open(f'/proc/{parents[0]}/cmdline').read()\n"
        "fork = server == open('/proc/self/cmdline').read()\n"
        "print(json.dumps({'parents': parents, 'me': os.getpid(), 'fork': fork}))\n"
    )
    started, launched = _started_then(code)
    [parent] = set(launched["parents"])
    assert parent != started["server"] and parent != launched["me"]
    assert launched["fork"]
    assert ends(started["server"]) and ends(parent)


def test_in_a_real_kernel_the_early_start_prints_nothing_and_leaves_nothing() -> None:
    cells = kernelspec.run_cells(
        [
            "import torch",
            "from notebook_accel import notebook_launcher",
            # (this cell only asks; it waits for the early start, which already happened)
            "from multiprocessing import forkserver\n"
            "from notebook_accel.launch.local import forkserver as warm\n"
            "warm._early.join()\n"
            "server = forkserver._forkserver._forkserver_pid\n"
            "fork = open(f'/proc/{server}/cmdline').read() == open('/proc/self/cmdline').read()\n"
            "(server, fork)",
            # The zygote's workers start as a fresh interpreter's: no event loop running (the
            # kernel runs its cells in one), nothing of the kernel (its Kernel and app cleared,
            # its loggers quiet); their IPython shell, display hook and builtins are ours (a
            # notebook's ranks display into its cells: reporting/shell.py).
            "import asyncio, builtins, logging, sys\n"
            "def fresh():\n"
            "    import IPython\n"
            "    from ipykernel.kernelbase import Kernel\n"
            "    from traitlets.config import Application\n"
            "    shell = IPython.get_ipython()\n"
            "    ours = type(shell).__module__ == 'notebook_accel.reporting.shell'\n"
            "    hooks = sys.displayhook == shell.show_value and builtins.get_ipython() is shell\n"
            "    gone = not Kernel.initialized() and not Application.initialized()\n"
            "    quiet = logging.getLogger('IPKernelApp').disabled\n"
            "    return asyncio.run(asyncio.sleep(0, 1)), ours and hooks, gone and quiet\n"
            "notebook_launcher(fresh, num_processes=2)",
        ],
        timeout=lambda cell: 120,
    )
    assert [_outputs(cell) for cell in cells[:2]] == [[], []]
    server, fork = ast.literal_eval(_text(cells[2]))
    assert fork is True  # torch was imported first: the forkserver is the kernel's zygote
    assert _text(cells[3]) == "[(1, True, True), (1, True, True)]"
    # run_cells shut the kernel down: its forkserver (and the workers') are gone with it.
    assert ends(server)


def _outputs(cell: Any) -> list[Any]:
    return list(cell.outputs)


def _text(cell: Any) -> str:
    [result] = [o for o in cell.outputs if o["output_type"] == "execute_result"]
    return str(result["data"]["text/plain"])


# torch imported first (a notebook's first cell), then the launcher: the forkserver is a
# fork of this process (a zygote), unless CUDA is in use here; ``force_cuda`` plays that on
# CPU (the check the zygote is refused by answers "in use").
_ZYGOTE = (
    "import json, os, sys\n"
    "import torch\n"
    "from notebook_accel.launch.local import forkserver as warm\n"
    "if sys.argv[1] == 'force_cuda':\n"
    "    warm._cuda_initialised = lambda: True\n"
    "from notebook_accel import notebook_launcher\n"
    "warm._early.join()\n"
    "from multiprocessing import forkserver\n"
    "early = forkserver._forkserver._forkserver_pid\n"
    # a module imported after the launcher: the zygote is forked again, the fallback is not
    "import tempfile\n"
    "folder = tempfile.mkdtemp()\n"
    "open(os.path.join(folder, 'imported_later.py'), 'w').close()\n"
    "sys.path.insert(0, folder)\n"
    "import imported_later\n"
    "def work():\n"
    "    import os, torch, torch.distributed as dist\n"
    "    dist.init_process_group('gloo')\n"
    "    t = torch.ones(1)\n"
    "    dist.all_reduce(t)\n"
    "    return t.item(), os.getppid()\n"
    "out = notebook_launcher(work, num_processes=2, hardware='cpu', output='none')\n"
    "server = forkserver._forkserver._forkserver_pid\n"
    "command = open(f'/proc/{server}/cmdline').read()\n"
    "print(json.dumps({'out': out, 'server': server, 'early': early, 'me': os.getpid(),"
    " 'fork': command == open('/proc/self/cmdline').read(),"
    " 'cuda': torch.cuda.is_initialized()}))\n"
)


def _zygote_run(branch: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if k != "NOTEBOOK_ACCEL_NO_WARMUP"}
    done = subprocess.run(
        [sys.executable, "-c", _ZYGOTE, branch],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    [line] = done.stdout.splitlines()  # nothing else printed
    seen: dict[str, Any] = json.loads(line)
    assert ends(seen["server"]) and ends(seen["early"])  # gone with the process, either way
    return seen


def test_torch_imported_first_makes_the_forkserver_a_fork_of_the_notebook() -> None:
    seen = _zygote_run("zygote")
    assert seen["fork"]  # this process's command line: a fork of it
    assert seen["out"] == [[2.0, seen["server"]]] * 2  # the workers are the zygote's
    assert seen["server"] != seen["early"]  # forked again after the module's import
    assert seen["cuda"] is False


def test_cuda_in_use_in_the_notebook_falls_back_to_a_fresh_forkserver() -> None:
    seen = _zygote_run("force_cuda")
    assert not seen["fork"]  # a fresh interpreter: nothing of this process's CUDA state
    assert seen["server"] == seen["early"]  # never replaced by a fork, imports or not
    assert seen["out"] == [[2.0, seen["server"]]] * 2
