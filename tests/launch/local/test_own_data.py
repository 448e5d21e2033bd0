"""What the notebook frees is not held by the forkserver (launch/local/own_data.py): its own
large buffers are left out of the zygote's fork, so neither the zygote nor its workers hold
them once the notebook lets them go; what a worker could reach by reference is kept.

Each case runs a notebook-like caller (``python -c``) or a real kernel (nbclient), and reads
the processes' memory from ``/proc/<pid>/smaps_rollup``.
"""

from __future__ import annotations

import ast
import json
import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests import kernelspec
from tests.launch.helpers import ends

MiB = 1 << 20

# Read by the callers below: a process's private memory (pages no other process maps), and
# processes' proportional set size.
_PRIVATE = textwrap.dedent(r"""
    import json, os, pathlib, re, sys

    def rollup(pid):
        text = pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text()
        return {k: int(v) * 1024 for k, v in re.findall(r"^(\w+):\s+(\d+) kB", text, re.M)}

    def private(pid):
        fields = rollup(pid)
        return fields["Private_Clean"] + fields["Private_Dirty"]

    def pss(pids):  # pages shared by these processes only count once in the sum
        return sum(rollup(pid)["Pss"] for pid in pids)

    def server():
        from multiprocessing import forkserver
        return forkserver._forkserver._forkserver_pid

    def report(**seen):
        print(json.dumps(seen), flush=True)
""")


def _run(code: str, cwd: Path) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if k != "NOTEBOOK_ACCEL_NO_WARMUP"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=environ,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    seen: dict[str, Any] = json.loads(line)
    return seen


def _freed(tmp_path: Path, make: bool) -> dict[str, Any]:
    """A caller that makes 256 MiB (a tensor, an array, a frame) or not, imports a module
    (the launch renews the zygote: a fork of it now), launches with a captured tensor, then
    frees what it made; the zygote's and its idle workers' private memory after that."""
    (tmp_path / "imported_late.py").write_text("VALUE = 1\n")
    code = (
        _PRIVATE
        + _FRAMES
        + textwrap.dedent(f"""
        import gc
        import numpy as np, torch
        from notebook_accel import notebook_launcher
        from notebook_accel.launch.local import forkserver as warm
        from notebook_accel.launch.local.idle import idle_pool
        warm._early.join()
        if {make}:
            data = torch.ones(32, 1024, 1024)  # 128 MiB
            array = np.ones(8 * 1024 * 1024)  # 64 MiB
            frame = _FRAME(np.ones((2 * 1024 * 1024, 4)))  # 64 MiB
        sys.path.insert(0, {str(tmp_path)!r})
        import imported_late
        captured = torch.arange(1 << 20)  # 8 MiB, through shared memory

        def work():
            import sys
            return int(captured.sum()), "imported_late" in sys.modules

        out = notebook_launcher(work, num_processes=2, output="none")
        idle_pool.settle()
        if {make}:
            del data, array, frame
        gc.collect()
        zygote, idle = server(), sorted(idle_pool.pids())
        report(out=out, zygote=private(zygote), idle=[private(p) for p in idle],
               pss=pss([zygote, *idle]))
    """)
    )
    return _run(code, tmp_path)


def test_what_the_notebook_frees_is_held_by_no_process_of_ours(tmp_path: Path) -> None:
    made = _freed(tmp_path, make=True)
    never = _freed(tmp_path, make=False)
    expected = [(1 << 20) * ((1 << 20) - 1) // 2, True]
    assert made["out"] == never["out"] == [expected] * 2  # captured data still arrives
    # The zygote was forked while the 256 MiB existed; freed since, they are nobody's: not
    # the zygote's private pages, nor pages it shares with its idle workers alone (which
    # are private to none of them: their PSS, summed, counts them).
    assert abs(made["zygote"] - never["zygote"]) < 16 * MiB, (made, never)
    assert len(made["idle"]) == len(never["idle"]) == 2
    for ours, theirs in zip(made["idle"], never["idle"], strict=True):
        assert abs(ours - theirs) < 16 * MiB, (made, never)
    assert abs(made["pss"] - never["pss"]) < 16 * MiB, (made, never)


def test_what_a_worker_reaches_by_reference_stays_in_the_fork(tmp_path: Path) -> None:
    # A module's tensors and arrays, which the notebook shares in every way it can, reach the
    # function by reference (the module is importable): the workers read them from the
    # zygote's memory, unchanged. The notebook's own buffer is left out of the fork.
    (tmp_path / "tables.py").write_text(
        textwrap.dedent("""
            import weakref
            import numpy as np, torch
            TABLE = torch.arange(1 << 20, dtype=torch.float64)  # 8 MiB each
            ARRAY = np.arange(1 << 20, dtype=np.float64)
            BASE = torch.arange(1 << 20, dtype=torch.float64)
            REGISTRY = []
            WEAK = weakref.WeakValueDictionary()
        """)
    )
    code = _PRIVATE + textwrap.dedent(f"""
        import numpy as np, torch
        from notebook_accel import notebook_launcher
        from notebook_accel.launch.local import own_data
        sys.path.insert(0, {str(tmp_path)!r})
        import tables
        from tables import TABLE  # the module's own object
        every_other = tables.ARRAY[::2]  # a numpy view of the module's array
        tail = tables.BASE[1:]  # a torch view of the module's tensor
        tables.REGISTRY.append(torch.full((1 << 20,), 2.0, dtype=torch.float64))
        mine = torch.full((1 << 20,), 3.0, dtype=torch.float64)
        tables.WEAK["mine"] = weak = torch.full((1 << 20,), 4.0, dtype=torch.float64)
        own = torch.ones(1 << 20, dtype=torch.float64)  # nobody else's
        found = own_data.own_buffers()

        def work():
            import tables
            return [
                float(tables.TABLE.sum()), float(tables.ARRAY.sum()), float(tables.BASE.sum()),
                float(tables.REGISTRY[0].sum()), float(tables.WEAK["mine"].sum()),
            ]

        out = notebook_launcher(work, num_processes=2, output="none")
        left = sorted(int(o.untyped_storage().data_ptr()) for o in found.owners
                      if isinstance(o, torch.Tensor))
        report(out=out, left=left, own=own.untyped_storage().data_ptr(),
               mine=mine.untyped_storage().data_ptr())
    """)
    seen = _run(code, tmp_path)
    n = float(1 << 20)
    assert seen["out"] == [[n * (n - 1) / 2, n * (n - 1) / 2, n * (n - 1) / 2, 2 * n, 4 * n]] * 2
    # Left out: the notebook's own tensors ("mine" too: only the notebook refers to it).
    assert seen["left"] == sorted([seen["own"], seen["mine"]])


def test_in_a_real_kernel_a_freed_tensor_array_and_frame_are_given_back(tmp_path: Path) -> None:
    # The data exist when the import's cell ends (the zygote is renewed then); one is the
    # cell's displayed value (IPython's Out keeps it, as the notebook does), and the launch
    # captures a tensor. Neither the zygote nor its idle workers map a page of them, and
    # after `del` (and Out's entry) the zygote's private memory has not grown.
    (tmp_path / "imported_late.py").write_text("VALUE = 1\n")
    with kernelspec.selected(tmp_path / "jupyter"):
        cells = kernelspec.run_cells(
            [
                _PRIVATE + _RESIDENT + _FRAMES,
                "import gc\nimport numpy as np, torch\n"
                "from notebook_accel import notebook_launcher\n"
                "from notebook_accel.launch.local import forkserver as warm\n"
                "from notebook_accel.launch.local.idle import idle_pool\n"
                "warm._early.join()",
                "data = torch.ones(32, 1024, 1024)\n"
                "array = np.ones(8 * 1024 * 1024)\n"
                "frame = _FRAME(np.ones((2 * 1024 * 1024, 4)))\n"
                "places = [(data.data_ptr(), data.nbytes), (array.ctypes.data, array.nbytes),\n"
                "          (_values(frame).ctypes.data, _values(frame).nbytes)]\n"
                "data",
                f"sys.path.insert(0, {str(tmp_path)!r})\nimport imported_late",
                "out = notebook_launcher(lambda: float(data[0, 0, :4].sum()), num_processes=2,"
                " output='none')\n"
                "idle_pool.settle()\n"
                "ours = [server(), *idle_pool.pids()]\n"
                "held = [resident(pid, places) for pid in ours]\n"
                "before = private(server())\n"
                "del data, array, frame, Out[3], _, _3\ngc.collect()\n"
                "(out, held, before, private(server()), server())",
            ],
            timeout=lambda cell: 180,
        )
    errors = [o for c in cells for o in c.outputs if o["output_type"] == "error"]
    assert not errors, "\n".join(errors[0]["traceback"])
    [result] = [o for o in cells[4].outputs if o["output_type"] == "execute_result"]
    out, held, before, after, zygote = ast.literal_eval(result["data"]["text/plain"])
    assert out == [4.0, 4.0]
    # The zygote and its two idle workers: no page of the data, but each buffer's partial
    # first and last pages (its allocator's header: forked as before).
    assert len(held) == 3 and all(h <= 3 * 2 * mmap.PAGESIZE for h in held), held
    assert after - before < 16 * MiB, (before, after)
    assert ends(zygote)  # the kernel was shut down: nothing left


# A pandas frame where pandas is installed (the matrix's notebook environments may lack it),
# else the array itself.
_FRAMES = textwrap.dedent("""
    try:
        from pandas import DataFrame as _FRAME
    except ImportError:
        _FRAME = lambda array: array

    def _values(frame):
        return getattr(frame, "values", frame)
""")


# Read by the kernel: the bytes of ``places`` that process ``pid`` has in memory and that are
# the kernel's own pages (the same page frame, where /proc shows frames: as root), read page by
# page from /proc/PID/pagemap. Counting whole mappings (smaps' Rss) would also count what a
# mapping merged with a buffer's partial first or last page holds, or what the process mapped
# later where a buffer left out of its fork would have been.
_RESIDENT = textwrap.dedent("""
    import os, struct

    def _entries(pid, start, n):
        page = os.sysconf("SC_PAGE_SIZE")
        first, last = start // page, (start + n - 1) // page
        with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
            pagemap.seek(first * 8)
            raw = pagemap.read((last - first + 1) * 8)
        return struct.unpack(f"{len(raw) // 8}Q", raw)

    def resident(pid, places):
        page, frame = os.sysconf("SC_PAGE_SIZE"), (1 << 55) - 1
        total = 0
        for start, n in places:
            ours = _entries(os.getpid(), start, n)
            for theirs, mine in zip(_entries(pid, start, n), ours):
                present = theirs >> 63 & 1
                if present and (not theirs & frame or theirs & frame == mine & frame):
                    total += page
        return total
""")


# -- what is found, in a namespace of the test's (no process started) -------------------------


def _owners(namespace: dict[str, Any], budget: int = 50_000) -> list[str]:
    """The names in ``namespace`` whose objects own_data leaves out of the fork."""
    from notebook_accel.launch.local import own_data

    found = own_data.found_in([namespace], set(), budget)
    ids = {id(owner) for owner in found.owners}
    return sorted(name for name, value in namespace.items() if id(value) in ids)


def test_only_what_the_namespace_alone_reaches_is_found() -> None:
    import types
    import weakref

    import numpy as np
    import torch

    module = types.ModuleType("a_module_of_the_test")
    module.TABLE = torch.ones(1 << 18)  # 1 MiB
    sys.modules[module.__name__] = module
    try:
        ns: dict[str, Any] = {
            "data": torch.ones(1 << 18),  # found, with its view
            "array": np.ones(1 << 17),  # found
            "small": torch.ones(10),  # too small
            "shared": module.TABLE,  # a module's
            "saved": torch.ones(1 << 18, requires_grad=True),  # autograd holds it: sin saves
            # its input
            "weak": torch.ones(1 << 18),  # a weak reference from outside
            "mine": torch.ones(1 << 18),  # a weak reference from inside only
        }
        ns["view"] = ns["data"][1:]
        ns["y"] = ns["saved"].sin()
        outside = weakref.WeakValueDictionary({"w": ns["weak"]})
        ns["cache"] = weakref.WeakValueDictionary({"m": ns["mine"]})
        assert _owners(ns) == ["array", "data", "mine", "view", "y"]
        assert len(outside) == 1
    finally:
        del sys.modules[module.__name__]


def _nested(depth: int) -> dict[str, Any]:
    import torch

    chain: dict[str, Any] = {"data": torch.ones(1 << 18)}
    for _ in range(depth - 1):
        chain = {"next": chain}
    return chain


def test_what_is_not_read_stays_in_the_fork() -> None:
    import torch

    from notebook_accel.launch.local import own_data

    namespace = {"chain": _nested(7)}  # the tensor: held by the namespace alone
    found = own_data.found_in([namespace], set())
    assert len(found.owners) == 1 and found.complete
    found = own_data.found_in([namespace], set(), budget=3)
    assert found.owners == [] and not found.complete  # the budget ran out first
    namespace = {"wide": [torch.ones(1 << 18)] + [0] * (1 << 14)}  # a container too wide
    assert own_data.found_in([namespace], set()).owners == []
    namespace = {"narrow": [torch.ones(1 << 18)] + [0] * 100}
    assert len(own_data.found_in([namespace], set()).owners) == 1
