"""CUDA tensors through the shared-memory payload (issue 9): real workers on the GPUs.

A CUDA tensor captured in the notebook travels as one host copy in shared memory and lands on
each worker's own GPU (``cuda:local_rank``, the device ``Accelerator().device`` gives); a CUDA
tensor a worker returns comes back on the device index it had.
"""

from __future__ import annotations

import os

import pytest
import torch

from notebook_accel import clear_shared_cache, notebook_launcher, shared_cache_info

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20


def test_a_captured_cuda_tensor_lands_on_each_workers_own_gpu() -> None:
    clear_shared_cache()
    processes = min(2, torch.cuda.device_count())
    x = torch.arange(MiB, dtype=torch.float32, device="cuda")  # 4 MiB on cuda:0

    def where() -> tuple[str, float, torch.Tensor]:
        x.add_(int(os.environ["RANK"]) + 1)  # the worker's own copy
        return str(x.device), x[5].item(), x[:4].clone()

    base = shared_cache_info().copied_bytes
    results = notebook_launcher(where, num_processes=processes, hardware="cuda")
    assert [r[0] for r in results] == [f"cuda:{i}" for i in range(processes)]
    assert [r[1] for r in results] == [5.0 + rank + 1 for rank in range(processes)]
    # Returned CUDA tensors come back on the device index they had in the worker.
    assert [str(r[2].device) for r in results] == [f"cuda:{i}" for i in range(processes)]
    assert x[5].item() == 5.0  # the notebook's tensor is unchanged
    assert shared_cache_info().copied_bytes - base == x.nbytes

    # Unchanged: the next launch copies nothing; changed in place: it copies again.
    notebook_launcher(where, num_processes=processes, hardware="cuda")
    assert shared_cache_info().copied_bytes - base == x.nbytes
    x.mul_(2)
    results = notebook_launcher(where, num_processes=processes, hardware="cuda")
    assert results[0][1] == 11.0
    assert shared_cache_info().copied_bytes - base == 2 * x.nbytes
    clear_shared_cache()


def test_a_large_cuda_result_comes_back_through_shared_memory() -> None:
    def make() -> dict[str, torch.Tensor]:
        model = torch.nn.Linear(1024, 1024).to(f"cuda:{os.environ['LOCAL_RANK']}")
        with torch.no_grad():
            model.weight.fill_(3.0)
        return model.state_dict()

    [state] = notebook_launcher(make, num_processes=1, hardware="cuda")
    assert state["weight"].device == torch.device("cuda", 0)
    assert state["weight"].sum().item() == 3.0 * MiB
