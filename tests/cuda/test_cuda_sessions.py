"""Sessions on CUDA: one NCCL worker per GPU kept across runs; the model stays on its GPU
between runs, an interrupt keeps the session and its group, closing leaves nothing on the GPUs.

The functions are made inside ``_functions`` so that they travel by value, as a notebook's do,
and run in the workers' namespace (a module's functions would keep their module's globals).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from notebook_accel import Workers
from tests.launch.helpers import worker_processes


def _functions() -> dict[str, Callable[..., Any]]:
    def build() -> None:
        global accelerator, model, optimizer
        import torch

        from notebook_accel import Accelerator

        accelerator = Accelerator()
        model = torch.nn.Linear(64, 64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)

    def train(steps: int) -> tuple[str, int]:
        import torch

        for _ in range(steps):
            loss = model(torch.randn(8, 64, device=accelerator.device)).pow(2).mean()
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
        return str(next(model.parameters()).device), accelerator.step

    def all_reduce_rank() -> float:
        import torch

        t = torch.full((1,), float(accelerator.process_index + 1), device=accelerator.device)
        # NCCL, in the group the first run made; one GPU has no group (accelerate makes
        # none for one process either): the session answering is what is shown there
        return float(accelerator.reduce(t, reduction="sum").item())

    def spins() -> None:
        import time

        import torch

        x = torch.ones(1024, device=accelerator.device)
        while True:
            x = x * 1.0001
            torch.cuda.synchronize()
            time.sleep(0.01)

    return {f.__name__: f for f in (build, train, all_reduce_rank, spins)}


def test_a_session_keeps_one_nccl_worker_per_gpu_and_its_model_on_it(
    gpu_count: int,
    settled: Callable[[set[int], float], set[int]],
    gpu_processes: Callable[[], set[int]],
) -> None:
    f = _functions()
    before = gpu_processes()
    n = gpu_count
    with Workers(hardware="cuda") as w:
        assert w.num_processes == n
        w.run(f["build"])
        first = w.run(f["train"], 5)
        second = w.run(f["train"], 5)  # the same model, on the same GPU, trained on
        assert first == [(f"cuda:{i}", 5) for i in range(n)]
        assert second == [(f"cuda:{i}", 10) for i in range(n)]
        assert w.run(f["all_reduce_rank"]) == [n * (n + 1) / 2] * n
    assert worker_processes() == []
    assert settled(before, 15.0) == before  # no CUDA context left by the session


def test_an_interrupt_on_cuda_keeps_the_session_and_its_group(gpu_count: int) -> None:
    f = _functions()
    n = gpu_count
    with Workers(hardware="cuda") as w:
        w.run(f["build"])
        stop = threading.Event()
        threading.Timer(2.0, stop.set).start()  # the panel's Stop, two seconds in
        with pytest.raises(KeyboardInterrupt) as caught:
            w.call(f["spins"], stop=stop)
        assert any("still usable" in note for note in caught.value.__notes__)
        assert w.run(f["all_reduce_rank"]) == [n * (n + 1) / 2] * n
