"""Sessions (Workers) driven from this process: real workers on CPU/gloo, real files as gates.

The notebook-facing proofs (cells, %%distributed, background output) are in
test_session_kernel.py; these are the ones a plain process shows as well.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from notebook_accel import (
    ConfigError,
    LaunchTimeoutError,
    SessionClosedError,
    Workers,
    notebook_launcher,
)
from notebook_accel.faces.magic import parse_ranks
from tests.launch.helpers import worker_processes

pytestmark = pytest.mark.slow


def _wait_for(path: Path, seconds: float = 60) -> None:
    """Until a worker has written ``path`` (the bound only ends a failing test)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("options", "parameter"),
    [
        ({"cluster": "ray"}, "cluster"),
        ({"num_nodes": 2}, "num_nodes"),
        ({"max_restarts": 1}, "max_restarts"),
        ({"mixed_precision": "fp64"}, "mixed_precision"),
        ({"dynamo_backend": "fastest"}, "dynamo_backend"),
    ],
)
def test_what_a_session_cannot_do_is_a_config_error_before_any_worker(
    options: dict[str, Any], parameter: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Workers(num_processes=2, hardware="cpu", **options)
    assert caught.value.parameter == parameter
    assert worker_processes() == []


def test_bad_ranks_and_timeouts_are_config_errors_and_the_session_goes_on() -> None:
    with Workers(num_processes=2, hardware="cpu") as w:
        with pytest.raises(ConfigError, match="ranks"):
            w.call(len, ([],), ranks=[2])
        with pytest.raises(ConfigError, match="timeout"):
            w.run(len, [], timeout=-1)
        with pytest.raises(ConfigError, match="--ranks"):
            parse_ranks("0-5", w.num_processes)
        with pytest.raises(SyntaxError):
            w.run_cell("def broken(:\n")  # raised here, before any worker sees it
        assert parse_ranks("1", 2) == [1] and parse_ranks(None, 2) is None
        assert w.run(len, [1, 2]) == [2, 2]


def test_training_in_three_cells_gives_the_weights_of_one_launch() -> None:
    def build() -> None:
        global accelerator, model, optimizer
        import torch

        from notebook_accel import Accelerator

        accelerator = Accelerator()
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        model, optimizer = accelerator.prepare(model, optimizer)

    def train(steps: int) -> None:
        import torch

        for _ in range(steps):
            x = torch.randn(4, 8)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()

    def weights() -> Any:
        return [p.detach().clone() for p in model.parameters()]

    def all_at_once() -> Any:
        build()
        train(100)
        return weights()

    launched = notebook_launcher(all_at_once, num_processes=2, hardware="cpu", seed=7)
    with Workers(num_processes=2, hardware="cpu", seed=7) as w:
        w.run(build)
        w.run(train, 50)
        w.run(train, 50)
        kept = w.run(weights)
    for ours, theirs in zip(kept, launched, strict=True):
        assert all((a == b).all() for a, b in zip(ours, theirs, strict=True))


def test_a_rank_that_ignores_the_interrupt_gets_the_session_torn_down(tmp_path: Path) -> None:
    marker = tmp_path / "stubborn"

    def stubborn(path: str) -> None:
        import os
        import time

        if os.environ["RANK"] == "1":
            open(path, "w").close()
            while True:
                try:
                    time.sleep(60)
                except KeyboardInterrupt:
                    pass  # keeps going

    w = Workers(num_processes=2, hardware="cpu")
    stop = threading.Event()
    threading.Thread(target=lambda: (_wait_for(marker), stop.set()), daemon=True).start()
    with pytest.raises(KeyboardInterrupt) as caught:
        w.call(stubborn, (str(marker),), stop=stop)
    assert any("not every rank came back" in note for note in caught.value.__notes__)
    assert w.closed and worker_processes() == []
    with pytest.raises(SessionClosedError, match="restart"):
        w.run(len, [])


def test_a_timeout_interrupts_the_run_and_keeps_the_session() -> None:
    with Workers(num_processes=2, hardware="cpu", timeout=60) as w:
        w.push(kept="yes")
        with pytest.raises(LaunchTimeoutError, match="interrupted") as caught:
            w.run(time.sleep, 60, timeout=1)
        assert any("still usable" in note for note in caught.value.__notes__)
        assert w.pull("kept") == ["yes", "yes"]


def test_a_submitted_job_runs_while_this_process_works_and_the_next_call_waits(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"

    def waits_for(path: str) -> int:
        import os
        import time

        while not os.path.exists(path):
            time.sleep(0.01)
        return int(os.environ["RANK"])

    with Workers(num_processes=2, hardware="cpu") as w:
        job = w.submit(waits_for, str(gate))
        assert not job.done()
        with pytest.raises(TimeoutError, match="still running"):
            job.result(timeout=0.2)
        later: list[Any] = []
        waiting = threading.Thread(target=lambda: later.append(w.run(len, "ab")))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and later == []  # it waits for the job, not beside it
        gate.touch()
        assert job.result(timeout=60) == [0, 1]
        waiting.join(60)
        assert later == [[2, 2]]
        stopped = w.submit(time.sleep, 60)
        stopped.stop()
        assert stopped.done()
        with pytest.raises(KeyboardInterrupt):
            stopped.result()
        assert w.run(len, "abc") == [3, 3]  # every rank came back: usable


def test_two_sessions_and_a_launch_in_one_process_keep_to_themselves() -> None:
    first = Workers(num_processes=2, hardware="cpu")
    second = Workers(num_processes=1, hardware="cpu")
    try:
        first.push(name="first")
        second.push(name="second")
        assert notebook_launcher(lambda: 5, num_processes=2, hardware="cpu") == [5, 5]
        assert first.pull("name") == ["first", "first"]
        assert second.pull("name") == ["second"]
        first.close()
        assert second.run(lambda: name) == ["second"]  # noqa: F821  (a workers' name)
    finally:
        first.close()
        second.close()
    assert worker_processes() == []


def test_a_session_nobody_holds_ends_its_workers() -> None:
    w = Workers(num_processes=2, hardware="cpu")
    workers = [psutil.Process(pid) for pid in w.run(os.getpid)]
    del w
    gc.collect()
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert alive == []
