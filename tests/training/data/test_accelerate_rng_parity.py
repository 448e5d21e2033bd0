"""One body of accelerate-style training code, through accelerate 1.16 and through ours.

The body (``_train``) is what a ported script does: ``Accelerator()``, ``set_seed`` once, a
model with dropout, a loader, AdamW, ``prepare``, 2 epochs, no seeding after ``prepare``. Every
random draw (the loader's base seed, the shuffle's seed, the dropout masks) comes from the
global RNG in the order each library takes them, so the final weights are equal bit for bit
only if ours draws exactly when accelerate does, epoch after epoch. Each default loader
configuration runs on 1 and on 2 real processes (``debug_launcher``: one launch per library
and process count, every configuration inside it).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from notebook_accel import debug_launcher

pytest.importorskip("accelerate")

N = 22  # samples: with batches of 4 on 2 processes, the last round is short


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 5, generator=g)
    return x, x @ torch.randn(5, 1, generator=g)


class Stream(IterableDataset):  # type: ignore[type-arg]
    """An iterable dataset that shuffles itself from the global RNG (HF streaming's kind)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        x, y = _data()
        for i in torch.randperm(N).tolist():
            yield x[i], y[i]

    def __len__(self) -> int:
        return N


# name: (DataLoaderConfiguration options, loader kind[, steps after which epoch 1 breaks off])
CASES: dict[str, tuple[Any, ...]] = {
    "shuffle": ({}, "shuffle"),
    "shuffle_break": ({}, "shuffle", 2),
    "shuffle_generator": ({}, "generator"),
    "sequential": ({}, "sequential"),
    "seedable": ({"use_seedable_sampler": True}, "shuffle"),
    "seedable_data_seed": ({"use_seedable_sampler": True, "data_seed": 11}, "shuffle"),
    "seedable_break": ({"use_seedable_sampler": True}, "shuffle", 2),
    "split_batches": ({"split_batches": True}, "shuffle"),
    "uneven": ({"even_batches": False}, "shuffle"),
    "dispatch": ({"dispatch_batches": True}, "shuffle"),
    "dispatch_generator": ({"dispatch_batches": True}, "generator"),
    "dispatch_split": ({"dispatch_batches": True, "split_batches": True}, "shuffle"),
    "iterable": ({}, "stream"),
    "iterable_per_rank": ({"dispatch_batches": False}, "stream"),
}


def _loader(kind: str) -> DataLoader:
    if kind == "stream":
        return DataLoader(Stream(), batch_size=4)
    dataset = TensorDataset(*_data())
    if kind == "generator":
        generator = torch.Generator().manual_seed(123)
        return DataLoader(dataset, batch_size=4, shuffle=True, generator=generator)
    return DataLoader(dataset, batch_size=4, shuffle=kind == "shuffle")


def _train(
    library: str, options: dict[str, Any], kind: str, cut: int | None = None
) -> list[torch.Tensor]:
    if library == "accelerate":
        from accelerate import Accelerator, DataLoaderConfiguration
        from accelerate.utils import set_seed
    else:
        from notebook_accel import Accelerator, DataLoaderConfiguration  # type: ignore[assignment]
        from notebook_accel.utils import set_seed  # type: ignore[assignment]

    config = DataLoaderConfiguration(**options)
    accelerator = Accelerator(cpu=True, dataloader_config=config)  # type: ignore[arg-type]
    set_seed(42)
    loader = _loader(kind)
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        model.train()
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if epoch == 0 and step + 1 == cut:
                break
    weights = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    accelerator.wait_for_everyone()
    return weights


def _all_cases(library: str) -> dict[str, list[torch.Tensor]]:
    return {name: _train(library, *case) for name, case in CASES.items()}


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, int], list[dict[str, list[torch.Tensor]]]]:
    return {
        (library, processes): debug_launcher(_all_cases, (library,), num_processes=processes)
        for library in ("accelerate", "notebook_accel")
        for processes in (1, 2)
    }


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_same_weights_as_accelerate_after_two_epochs(
    runs: dict[tuple[str, int], list[dict[str, list[torch.Tensor]]]], case: str, processes: int
) -> None:
    theirs, ours = runs["accelerate", processes], runs["notebook_accel", processes]
    for rank in range(processes):
        for a, b in zip(ours[rank][case], theirs[rank][case], strict=True):
            assert torch.equal(a, b), (case, rank)


def test_the_comparison_sees_the_order_of_draws(
    runs: dict[tuple[str, int], list[dict[str, list[torch.Tensor]]]],
) -> None:
    # The data order and the dropout masks show in the weights: configurations that draw
    # otherwise train to other weights (so one draw more or less would show too).
    pairs = [("shuffle", "sequential"), ("shuffle", "shuffle_generator")]
    pairs += [("shuffle", "seedable"), ("seedable", "seedable_data_seed")]
    pairs += [("shuffle", "shuffle_break"), ("iterable", "sequential")]
    for processes in (1, 2):
        ours = runs["notebook_accel", processes][0]
        two = [("shuffle", "dispatch"), ("iterable", "iterable_per_rank")]
        for a, b in pairs + (two if processes == 2 else []):
            assert not torch.equal(ours[a][0], ours[b][0]), (a, b, processes)
