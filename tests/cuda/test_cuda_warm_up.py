"""CUDA used in the notebook before the launcher is imported: the forkserver that the import
starts early (forkserver.warm_up_early) is then not a fork of the notebook (the zygote, where
CUDA is not in use) but a fresh interpreter, so the workers it forks initialise CUDA
themselves (a fork of this process could not). A library imported after that does not make
the launch fork this process either (forkserver.renew refuses where CUDA is in use)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_cuda_initialised_before_the_launcher_is_imported_stays_out_of_the_workers() -> None:
    code = (
        "import json, os, torch\n"
        "x = torch.ones(4, device='cuda')  # CUDA initialised in the notebook first\n"
        "assert torch.cuda.is_initialized()\n"
        "from notebook_accel import notebook_launcher\n"
        "from notebook_accel.launch.local import forkserver as warm\n"
        "warm._early.join()\n"
        # a library imported after the launcher: still no fork of this process (its CUDA)
        "import tempfile, sys\n"
        "folder = tempfile.mkdtemp()\n"
        "open(os.path.join(folder, 'imported_later.py'), 'w').close()\n"
        "sys.path.insert(0, folder)\n"
        "import imported_later\n"
        "def work():\n"
        "    import os, torch\n"
        "    before = torch.cuda.is_initialized()\n"
        "    y = torch.full((4,), 2.0, device='cuda')\n"
        "    return {'before': before, 'sum': y.sum().item(), 'parent': os.getppid()}\n"
        "out = notebook_launcher(work, num_processes=1, hardware='cuda', output='none')\n"
        "command = open(f'/proc/{out[0][\"parent\"]}/cmdline').read()\n"
        "fork = command == open('/proc/self/cmdline').read()\n"
        "print(json.dumps({'out': out, 'me': os.getpid(), 'fork': fork}))\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "NOTEBOOK_ACCEL_NO_WARMUP"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    [rank0] = seen["out"]
    assert rank0["before"] is False  # nothing of the notebook's CUDA came along
    assert rank0["sum"] == 8.0
    assert rank0["parent"] != seen["me"]  # forked by the fresh forkserver, not by us
    assert seen["fork"] is False  # the fallback: not the zygote


def test_workers_of_the_zygote_initialise_cuda_themselves() -> None:
    # torch imported, CUDA untouched: the forkserver is a fork of this process (the zygote),
    # and its workers, which inherited no CUDA state, use the GPU.
    code = (
        "import json, os, torch\n"
        "from notebook_accel import notebook_launcher\n"
        "def work():\n"
        "    import os, torch\n"
        "    y = torch.full((4,), 2.0, device='cuda')\n"
        "    return {'sum': y.sum().item(), 'parent': os.getppid()}\n"
        "out = notebook_launcher(work, num_processes=1, hardware='cuda', output='none')\n"
        "command = open(f'/proc/{out[0][\"parent\"]}/cmdline').read()\n"
        "fork = command == open('/proc/self/cmdline').read()\n"
        "print(json.dumps({'out': out, 'fork': fork, 'here': torch.cuda.is_initialized()}))\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "NOTEBOOK_ACCEL_NO_WARMUP"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["fork"] is True and seen["here"] is False
    assert seen["out"][0]["sum"] == 8.0
