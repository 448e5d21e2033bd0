"""Launch latency: this project's notebook_launcher, HF accelerate's (fork) and Lightning's
``ddp_notebook`` (fork), side by side, at 2 and 16 CPU processes.

Each launcher runs a function that initialises the process group (Lightning's launcher
does it before the function), all-reduces one tensor and returns. Measured, each row in
fresh Python processes:

- first launch, fresh process: import the launcher, import torch, launch at once;
- first launch, notebook: import torch, import the launcher, 3 s later (a person writing the
  function) the launch, as in a fresh Jupyter kernel;
- warm launch: the median of 10 more launches in the process of the notebook row, each a
  re-run 0.5 s after the last one returned (a cell run again; the same pause for every
  launcher, so that what each does in the background after a launch is done).

Timed from the launcher's call to its return.

    python benchmarks/launch_latency.py            # needs the `bench` extra
    python benchmarks/launch_latency.py --num-processes 2 --num-processes 16
    python benchmarks/launch_latency.py --num-processes 16 --breakdown
    python benchmarks/launch_latency.py --after-imports     # only the rows after the imports

Measured on 2026-12-02, this 2-core machine with nothing else running (load 0.4-1.5), after
destroyed gloo groups were left to the workers' exit (launch/rank/worker_store.py):

    2 processes                      ours   accelerate  lightning  ours/acc  target
    first launch, fresh process    0.15 s      0.15 s     0.06 s     1.00x   <= 1.0 s
    first launch, notebook (3 s)   0.03 s      0.16 s     0.06 s     0.17x   <= 0.3 s
    warm launch                     24 ms      129 ms      61 ms     0.19x   <= 0.33x
    16 processes
    first launch, fresh process    0.41 s      0.34 s     0.21 s     1.20x
    first launch, notebook (3 s)   0.24 s      0.36 s     0.25 s     0.66x
    warm launch                    136 ms      422 ms     233 ms     0.32x   <= 0.5x

Before that change, the same day: warm 43 ms (0.31x) at 2 processes and 252-285 ms (0.55x) at
16: the function's destroy_process_group spent ~10 ms per rank in gloo's teardown.

After ``import transformers`` (``--after-imports``: only these rows; they follow the others
otherwise), at the first ``--num-processes``: each launcher in a fresh Jupyter kernel (real,
over Unix sockets) and in a script file, as a user has them.

- kernel: a cell imports torch and the launcher; a cell launches ``work`` 5 times (0.5 s
  apart, the first at once); a cell imports transformers and datasets (and BERT's classes);
  a cell launches ``bert_work`` (a tiny BERT built in every rank) 5 times the same way;
- script (``python train.py``): torch, the launcher, transformers and datasets imported at
  the top, then two launches of ``bert_work``, back to back.

Before forkserver.renew (2026-12-04, load 0.5-1.4), ours re-imported transformers in every
worker of every launch: kernel 2.67 s first after the imports, 2.33 s median (accelerate
0.15 / 0.15 s, Lightning 0.11 / 0.11 s); script 2.23 s and 2.26 s (accelerate 0.15 / 0.15).

After (the zygote renewed at the import cell's end, a script's launch forking the script;
same day, load 0.3):

    after `import transformers, datasets`      ours    acc.  light. ours/acc  target
    kernel: launch before the imports (med)  0.04 s  0.16 s  0.08 s    0.23x
    kernel: first launch after the imports   0.11 s  0.16 s  0.10 s    0.70x  <= 0.3 s, acc
    kernel: after the imports (median of 5)  0.07 s  0.16 s  0.10 s    0.41x  <= before+50ms
    kernel: after the imports (max of 5)     0.11 s  0.18 s  0.11 s    0.63x  <= 0.3 s
    script: first launch after the imports   0.19 s  0.16 s  0.11 s    1.20x
    script: second launch                    0.10 s  0.16 s  0.09 s    0.60x

The first launch after a renewal takes the new zygote's first workers (its first fork ~37 ms,
then ~15 ms each); a tiny BERT built in every rank adds ~40 ms to each launch on all three.
Kernel rows repeated (ours 5 times, accelerate 4, Lightning 3): ours 0.11-0.13 s first after
the imports, accelerate 0.17, Lightning 0.10-0.11. One earlier run of the whole table had a
kernel cell time out (120 s), launcher not recorded (the table now says which, and goes on).

``--breakdown`` (ours only) splits a launch with 16 processes into: when the last worker
entered the function, and how long the process group took after that (the rendezvous
proper), once with the launch's private store (a FileStore on a memfd of the notebook
process, launch/meet/rendezvous.py) and once with rank 0 hosting a TCPStore (torch's plain env://
way): the comparison says whether our store costs anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WARM = 10
PAUSE = 0.5  # seconds between warm launches
HUNG = 120  # seconds after which a row's process counts as hung (a row takes < 30 s)
TRIES = 3  # a hung row is measured again in a fresh process, up to this many times
NOTEBOOK_PAUSE = 3.0  # seconds between importing the launcher and the first launch
LAUNCHERS = ("ours", "accelerate", "lightning")
# Targets (issue 22) and last month's figures, printed beside today's.
TARGETS = {
    ("first_fresh", 2): "<= 1.0 s",
    ("first_notebook", 2): "<= 0.3 s",
    ("warm", 2): "<= 0.33x accelerate",
    ("warm", 16): "<= 0.5x accelerate",
}
LAST_MONTH = {
    ("first_fresh", 2): "0.85 s",
    ("warm", 2): "47 ms (0.38x)",
    ("warm", 16): "0.85x",
}

_CHILD = """
import json, os, socket, sys, time
which, n, order, warm, pause, wait = (
    sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]),
    float(sys.argv[6]),
)

def work():
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()

def fabric_work(fabric):
    import torch, torch.distributed as dist
    t = torch.ones(1)
    dist.all_reduce(t)  # Lightning made the group before calling us
    return t.item()

def import_launcher():
    global launch
    if which == "ours":
        from notebook_accel import notebook_launcher
        def launch():
            out = notebook_launcher(work, num_processes=n, hardware="cpu", output="none")
            assert out == [float(n)] * n, out
    elif which == "accelerate":
        from accelerate import notebook_launcher as accelerate_launcher
        def launch():
            with socket.socket() as probe:  # its default port, 29500, may be taken
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            accelerate_launcher(work, num_processes=n, use_port=str(port))  # returns None
    else:
        from lightning.fabric import Fabric
        def launch():
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
            fabric = Fabric(accelerator="cpu", devices=n, strategy="ddp_notebook")
            assert fabric.launch(fabric_work) == float(n)  # rank 0's value

def timed():
    start = time.perf_counter()
    launch()
    return time.perf_counter() - start

if order == "fresh":  # launcher, torch, launch at once
    import_launcher()
    import torch
else:  # notebook: torch, launcher, a pause, the launch
    import torch
    import_launcher()
    time.sleep(wait)
first = timed()
warms = []
for _ in range(warm):
    time.sleep(pause)
    warms.append(timed())
print(json.dumps({"first": first, "warm": warms}))
"""


_BREAKDOWN = """
import socket, statistics, sys, time
from notebook_accel import notebook_launcher

def work(t0, own_store, port):
    import os, time
    import torch, torch.distributed as dist
    entered = time.time()
    if own_store:  # rank 0 hosts the store, as a bare env:// launch does
        del os.environ["NOTEBOOK_ACCEL_STORE"]  # env:// falls back to torch's own handler
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    done = time.time()
    dist.destroy_process_group()
    return entered - t0, done - t0

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

n, reps = int(sys.argv[1]), int(sys.argv[2])
notebook_launcher(lambda: 1, num_processes=n, hardware="cpu", output="none")  # warm
for label, own in (("private FileStore", False), ("TCPStore in rank 0", True)):
    last, group = [], []
    for _ in range(reps):
        t0 = time.time()
        res = notebook_launcher(work, args=(t0, own, free_port()), num_processes=n,
                                hardware="cpu", output="none")
        last.append(max(r[0] for r in res))
        group.append(max(r[1] for r in res) - last[-1])
    last_ms, group_ms = statistics.median(last) * 1000, statistics.median(group) * 1000
    print(f"{label:24}{last_ms:14.0f}{group_ms:18.0f}")
"""


def breakdown(num_processes: int) -> None:
    print(f"{num_processes} CPU processes, median of {WARM} warm launches (ms):")
    print(f"{'':24}{'last worker in':>14}{'group ready after':>18}")
    subprocess.run(
        [sys.executable, "-c", _BREAKDOWN, str(num_processes), str(WARM)], cwd=ROOT, check=True
    )


def measure(which: str, num_processes: int, order: str, warm: int) -> dict[str, float]:
    """One row's figures, from a fresh process; again (up to TRIES) if that process hung."""
    for attempt in range(1, TRIES + 1):
        try:
            return _measure_once(which, num_processes, order, warm)
        except _Hung as exc:
            print(f"{exc}; attempt {attempt} of {TRIES}", file=sys.stderr)
    raise RuntimeError(f"{which} {order} x{num_processes} hung in all {TRIES} attempts")


class _Hung(Exception):
    pass


def _measure_once(which: str, num_processes: int, order: str, warm: int) -> dict[str, float]:
    wait = NOTEBOOK_PAUSE if order == "notebook" else 0.0
    command = [sys.executable, "-c", _CHILD, which, str(num_processes), order, str(warm)]
    child = subprocess.Popen(
        [*command, str(PAUSE), str(wait)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        start_new_session=True,  # its workers too are stopped if it hangs
    )
    try:
        stdout, stderr = child.communicate(timeout=HUNG)
    except subprocess.TimeoutExpired:
        # Seen with accelerate at 16 processes (about one row in three on 2026-12-02): a
        # forked child deadlocked on a lock (futex) that one of the notebook's threads held
        # at the fork, and its peers wait for it.
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise _Hung(f"{which} {order} x{num_processes} hung (> {HUNG} s)") from None
    done = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{which} failed:\n{done.stderr[-3000:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    warm_median = statistics.median(data["warm"]) if data["warm"] else math.nan
    return {"first": data["first"], "warm": warm_median}


def _figure(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value * 1000:.0f} ms" if unit == "ms" else f"{value:.2f} s"


def report(num_processes: int) -> None:
    rows: dict[str, dict[str, float]] = {}
    for which in LAUNCHERS:
        try:
            fresh = measure(which, num_processes, "fresh", 0)
            notebook = measure(which, num_processes, "notebook", WARM)
        except RuntimeError as exc:
            print(f"{which} not measured: {exc}", file=sys.stderr)
            nan = math.nan
            rows[which] = {"first_fresh": nan, "first_notebook": nan, "warm": nan}
            continue
        rows[which] = {
            "first_fresh": fresh["first"],
            "first_notebook": notebook["first"],
            "warm": notebook["warm"],
        }
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    print(
        f"\nlaunch latency, {num_processes} CPU processes, init_process_group + all_reduce "
        f"(load average {load:.1f})"
    )
    print(
        f"{'':34}{'ours':>9}{'accelerate':>12}{'lightning':>11}{'ours/acc':>10}"
        f"{'target':>22}{'last month':>16}"
    )
    labels = (
        ("first_fresh", "first launch, fresh process", "s"),
        ("first_notebook", f"first launch, notebook ({NOTEBOOK_PAUSE:g} s)", "s"),
        ("warm", f"warm launch (median of {WARM})", "ms"),
    )
    for key, label, unit in labels:
        ours, theirs, lightning = (rows[w][key] for w in LAUNCHERS)
        ratio = ours / theirs if theirs else math.nan
        print(
            f"{label:34}{_figure(ours, unit):>9}{_figure(theirs, unit):>12}"
            f"{_figure(lightning, unit):>11}{ratio:>9.2f}x"
            f"{TARGETS.get((key, num_processes), ''):>22}"
            f"{LAST_MONTH.get((key, num_processes), ''):>16}"
        )


# --- after `import transformers` (issue 31): the launch once the caller has imported more ---

# Defines launch(fn) for sys.argv-free use: `which` and `n` are set before this runs.
_LAUNCHERS = """
import os, socket, statistics, time

def work():
    import torch, torch.distributed as dist
    made = not dist.is_initialized()  # Lightning has joined the group already
    if made:
        dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    if made:
        dist.destroy_process_group()
    return t.item()

def bert_work():
    import torch, torch.distributed as dist
    from transformers import BertConfig, BertForSequenceClassification
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64)
    model = BertForSequenceClassification(config)
    t = torch.tensor([float(sum(p.numel() for p in model.parameters()))])
    dist.all_reduce(t)
    if made:
        dist.destroy_process_group()
    return t.item()

def free_port():
    with socket.socket() as probe:  # accelerate's default port, 29500, may be taken
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

if which == "ours":
    from notebook_accel import notebook_launcher
    def launch(fn):
        notebook_launcher(fn, num_processes=n, hardware="cpu", output="none")
elif which == "accelerate":
    from accelerate import notebook_launcher as accelerate_launcher
    def launch(fn):
        accelerate_launcher(fn, num_processes=n, use_port=str(free_port()))
else:
    from lightning.fabric import Fabric
    def launch(fn):
        os.environ["MASTER_PORT"] = str(free_port())
        fabric = Fabric(accelerator="cpu", devices=n, strategy="ddp_notebook")
        fabric.launch(lambda fabric: fn())

def timed(fn, times, pause):
    seconds = []
    for i in range(times):
        time.sleep(pause if i else 0.0)  # the first at once, as the cell starts
        start = time.perf_counter()
        launch(fn)
        seconds.append(time.perf_counter() - start)
    return seconds
"""

_IMPORTS = (
    "import transformers, datasets\n"
    "from transformers import BertConfig, BertForSequenceClassification\n"
)

_SCRIPT = """
import json, sys
which, n = sys.argv[1], int(sys.argv[2])
import torch
{launchers}
{imports}
seconds = timed(bert_work, 2, 0.0)
print(json.dumps({{"first": seconds[0], "second": seconds[1]}}))
"""

AFTER_REPS = 5  # launches per kernel row (medians of 5)


def _cell(client: Any, code: str) -> str:
    """Run one cell in the kernel; its stdout (raises with the traceback if it failed)."""
    out: list[str] = []

    def hook(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
            out.append(message["content"]["text"])

    reply = client.execute_interactive(code, output_hook=hook, timeout=HUNG)
    if reply["content"]["status"] != "ok":
        raise RuntimeError("\n".join(reply["content"].get("traceback", [])))
    return "".join(out)


def _last_json(text: str) -> Any:
    return json.loads(text.strip().splitlines()[-1])  # after what the launcher printed


def kernel_after_imports(which: str, num_processes: int) -> dict[str, Any]:
    """In a fresh Jupyter kernel: torch and the launcher imported; AFTER_REPS launches of
    ``work``; then a cell importing transformers and datasets; then AFTER_REPS launches of
    ``bert_work`` (a tiny BERT built in every rank), PAUSE apart, the first at once."""
    from jupyter_client.manager import KernelManager

    environ = {**os.environ, "PYTHONWARNINGS": "ignore"}
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), environ.get("PYTHONPATH", "")) if p
    )
    folder = tempfile.TemporaryDirectory()
    # Unix sockets in a private folder: no TCP port for the kernel's channels.
    manager = KernelManager(kernel_name="python3", transport="ipc", ip=f"{folder.name}/kernel")
    manager.start_kernel(cwd=str(ROOT), env=environ)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=HUNG)
        _cell(client, f"import json, torch\nwhich, n = {which!r}, {num_processes}\n{_LAUNCHERS}")
        measure = f"print(json.dumps(timed({{}}, {AFTER_REPS}, {PAUSE})))"
        before = _last_json(_cell(client, measure.format("work")))
        _cell(client, _IMPORTS)
        after = _last_json(_cell(client, measure.format("bert_work")))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        folder.cleanup()
    return {"before": before, "after": after}


def script_after_imports(which: str, num_processes: int) -> dict[str, float]:
    """``python train.py``: torch, the launcher, transformers and datasets imported at the
    top, then two launches of ``bert_work``."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "train.py"
        script.write_text(_SCRIPT.format(launchers=_LAUNCHERS, imports=_IMPORTS))
        done = subprocess.run(
            [sys.executable, str(script), which, str(num_processes)],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=HUNG,
            env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{which} script failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report_after_imports(num_processes: int) -> None:
    rows: dict[str, dict[str, float]] = {}
    for which in LAUNCHERS:
        try:
            kernel = kernel_after_imports(which, num_processes)
            script = script_after_imports(which, num_processes)
        except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as exc:
            print(f"{which} not measured after the imports: {exc!r}", file=sys.stderr)
            rows[which] = dict.fromkeys(AFTER_ROWS, math.nan)
            continue
        rows[which] = {
            "before": statistics.median(kernel["before"]),
            "after_first": kernel["after"][0],
            "after_median": statistics.median(kernel["after"]),
            "after_max": max(kernel["after"]),
            "script_first": script["first"],
            "script_second": script["second"],
        }
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    print(
        f"\nafter `import transformers, datasets`, {num_processes} CPU processes, a tiny BERT "
        f"built in every rank (load average {load:.1f})"
    )
    print(f"{'':44}{'ours':>9}{'accelerate':>12}{'lightning':>11}{'ours/acc':>10}{'target':>26}")
    for key, (label, target) in AFTER_ROWS.items():
        ours, theirs, lightning = (rows[w][key] for w in LAUNCHERS)
        ratio = ours / theirs if theirs else math.nan
        print(
            f"{label:44}{_figure(ours, 's'):>9}{_figure(theirs, 's'):>12}"
            f"{_figure(lightning, 's'):>11}{ratio:>9.2f}x{target:>26}"
        )


AFTER_ROWS = {
    "before": (f"kernel: launch before the imports (med. {AFTER_REPS})", ""),
    "after_first": ("kernel: first launch after the imports", "<= 0.3 s and <= acc"),
    "after_median": (f"kernel: after the imports (median of {AFTER_REPS})", "<= before+50ms"),
    "after_max": (f"kernel: after the imports (max of {AFTER_REPS})", "<= 0.3 s"),
    "script_first": ("script: first launch after the imports", ""),
    "script_second": ("script: second launch", ""),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-processes", type=int, action="append")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument(
        "--after-imports", action="store_true", help="only the rows after `import transformers`"
    )
    options = parser.parse_args()
    counts = options.num_processes or [2, 16]
    if options.breakdown:
        breakdown(counts[0])
        return
    if not options.after_imports:
        for count in counts:
            report(count)
    report_after_imports(counts[0])


if __name__ == "__main__":
    main()
