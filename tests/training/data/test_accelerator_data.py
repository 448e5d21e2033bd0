"""Prepared data loaders on 2 real processes: equal to one process, resume, iterable data.

The one-process references are plain PyTorch (no Accelerator) run in the test process, so
"equal" means what a user means: the same samples per global step as the loop they had.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SubsetRandomSampler,
    TensorDataset,
)

from notebook_accel import debug_launcher

N = 48  # samples: 6 global steps of 8 per epoch, 3 epochs = 18 steps


def make_dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 6, generator=g)
    y = x @ torch.randn(6, 2, generator=g) + 0.1 * torch.randn(N, 2, generator=g)
    return TensorDataset(x, y, torch.arange(N))


class ListIndexed(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A dataset indexed by lists of indices (as HF datasets are): for sampler=BatchSampler."""

    def __init__(self) -> None:
        self.data = make_dataset().tensors

    def __len__(self) -> int:
        return N

    def __getitem__(self, idx: list[int]) -> tuple[torch.Tensor, ...]:
        return tuple(t[idx] for t in self.data)


def make_loader(kind: str, batch: int, generator: torch.Generator | None) -> DataLoader:
    data = make_dataset()
    if kind == "batch_sampler":  # the RandomSampler lives inside the user's batch sampler
        return DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), batch, False))
    if kind == "sampler_is_batch_sampler":
        sampler = BatchSampler(RandomSampler(data), batch, False)
        return DataLoader(ListIndexed(), batch_size=None, sampler=sampler)
    return DataLoader(data, batch_size=batch, shuffle=True, generator=generator)


def make_model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def train(kind: str, batch: int, prepared: bool, split: bool = False) -> dict:
    """3 epochs of SGD, seeded before ``prepare`` (accelerate's order)."""
    acc = None
    generator = torch.Generator() if kind == "generator" else None
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if prepared:
        from notebook_accel.seeding import set_seed
        from notebook_accel.training.accelerator import Accelerator

        acc = Accelerator(split_batches=split)
        # Ranks start from different global RNG states: the shuffle must still agree (rank 0's
        # draws, which are those of a one-process run seeded the same).
        set_seed(42, device_specific=True)
        if generator is not None:
            generator.manual_seed(42)
        loader = make_loader(kind, batch, generator)
        model, opt, loader = acc.prepare(model, opt, loader)
    else:
        torch.manual_seed(42)
        if generator is not None:
            generator.manual_seed(42)
        loader = make_loader(kind, batch, generator)
        # What accelerate's prepare does on several processes: a generator-less sampler gets
        # a generator seeded by one draw from the global RNG, kept across epochs.
        holder = loader.sampler if kind == "sampler_is_batch_sampler" else loader.batch_sampler
        if holder.sampler.generator is None:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            holder.sampler.generator = torch.Generator().manual_seed(seed)
    seen = []
    for _ in range(3):
        for x, y, idx in loader:
            loss = F.mse_loss(model(x), y)
            if acc is not None:
                acc.backward(loss)
                idx = acc.gather(idx)
            else:
                loss.backward()
            opt.step()
            opt.zero_grad()
            seen.append(idx.tolist())
    module = acc.unwrap_model(model) if acc is not None else model
    return {"seen": seen, "weights": [p.detach().clone() for p in module.parameters()]}


KINDS = ["global_rng", "generator", "batch_sampler", "sampler_is_batch_sampler"]


def _equivalence() -> dict:
    out = {kind: train(kind, 4, prepared=True) for kind in KINDS}
    out["split"] = train("global_rng", 8, prepared=True, split=True)
    return out


def test_two_processes_equal_one_process_with_the_same_seed() -> None:
    ranks = debug_launcher(_equivalence, num_processes=2)
    for kind in [*KINDS, "split"]:
        ref = train("global_rng" if kind == "split" else kind, 8, prepared=False)
        assert len(ref["seen"]) == 18
        for result in ranks:
            mine = result[kind]
            assert mine["seen"] == ref["seen"], kind  # the same samples at every global step
            for a, b in zip(mine["weights"], ref["weights"], strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def _resume(folder: str, dispatch: bool) -> dict:
    from notebook_accel.seeding import set_seed
    from notebook_accel.training.accelerator import Accelerator
    from notebook_accel.training.data.config import DataLoaderConfiguration

    def setup(seed: int) -> tuple[Any, Any]:
        config = DataLoaderConfiguration(dispatch_batches=dispatch or None)
        acc = Accelerator(dataloader_config=config)
        set_seed(seed)
        loader = acc.prepare(
            DataLoader(TensorDataset(torch.arange(24)), batch_size=2, shuffle=True)
        )
        return acc, loader

    acc, loader = setup(1)
    first: list[list[int]] = []
    for step, (idx,) in enumerate(loader):
        first.append(idx.tolist())
        if step == 1:
            acc.save_state(folder)
    # A new run, seeded otherwise: len() before load_state must not pin the wrong order.
    acc, loader = setup(2)
    assert len(loader) == 6
    acc.load_state(folder)
    resumed = [idx.tolist() for (idx,) in loader]
    # accelerate's pattern: load_state, then skip_first_batches(loader, steps done).
    acc, loader = setup(3)
    acc.load_state(folder)
    skipped = [idx.tolist() for (idx,) in acc.skip_first_batches(loader, 2)]
    next_epoch = [idx.tolist() for (idx,) in loader]
    return {"first": first, "resumed": resumed, "skipped": skipped, "next": next_epoch}


def _resumes(folder: str) -> dict:
    # dispatch: the main process reads (and draws the shuffle's seed for) every rank
    return {d: _resume(f"{folder}{d}", d) for d in (False, True)}


def test_resume_after_len_follows_the_saved_order(tmp_path: Path) -> None:
    for both in debug_launcher(_resumes, args=(str(tmp_path / "ckpt"),), num_processes=2):
        for r in both.values():
            assert r["resumed"] == r["first"][2:]
            assert r["skipped"] == r["first"][2:]
            assert len(r["next"]) == 6 and r["next"] != r["first"]  # then a new epoch


def _loop_state() -> dict:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(gradient_accumulation_steps=2)
    model = acc.prepare(torch.nn.Linear(1, 1))
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(9.0)[:, None]), batch_size=2))
    for i, _ in enumerate(loader):
        if i == len(loader) - 1:
            break  # on the last batch: the end-of-loader state must not outlive the loop
    syncs = []
    for _ in range(4):
        with acc.accumulate(model):
            syncs.append(acc.sync_gradients)
    rank = acc.process_index
    gathered = acc.gather_for_metrics(torch.arange(5) + 5 * rank)
    return {"syncs": syncs, "gathered": gathered.tolist()}


def _schedulers() -> dict:
    from notebook_accel.training.accelerator import Accelerator

    out = {}
    cases = {
        "per_process": {},
        "split": {"split_batches": True},
        "accumulate": {"gradient_accumulation_steps": 2},
        "every_call": {"step_scheduler_with_optimizer": False, "gradient_accumulation_steps": 2},
        "fp16": {"mixed_precision": "fp16"},
    }
    for name, options in cases.items():
        acc = Accelerator(**options)  # type: ignore[arg-type]
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
        model, opt, sched = acc.prepare(model, opt, sched)
        for i in range(4):
            with acc.accumulate(model):
                loss = model(torch.ones(2, 2)).mean() * 0.01  # no fp16 overflow at 2**16
                if name == "fp16" and i == 3:
                    loss = loss * float("inf")  # this step is skipped: no scheduler step
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
        out[name] = sched.last_epoch
    return out


def _collectives() -> dict:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    rank = acc.process_index
    errors = {}
    calls = {
        "reduce": lambda: acc.reduce(3.0),
        "gather": lambda: acc.gather({"a": torch.ones(1), "b": "text"}),
        "broadcast": lambda: acc.broadcast([torch.ones(1), None]),
        "pad": lambda: acc.pad_across_processes([1, 2]),
    }
    for name, call in calls.items():
        try:
            call()
        except TypeError as e:
            errors[name] = str(e)
    return {
        "errors": errors,
        "max": acc.reduce(torch.tensor([rank + 1.0, 5.0 - rank]), "max").tolist(),
        "mixed": acc.gather_for_metrics([torch.tensor(rank), f"r{rank}"]),
    }


def _loop_state_and_collectives() -> tuple[dict, dict]:
    return _loop_state(), _collectives()


def test_loop_break_scheduler_and_collectives() -> None:
    both = debug_launcher(_loop_state_and_collectives, num_processes=2)
    loops, collectives = [r[0] for r in both], [r[1] for r in both]
    schedulers = debug_launcher(_schedulers, num_processes=2)
    for r in loops:
        assert r["syncs"] == [False, True, False, True]
        assert r["gathered"] == list(range(10))  # nothing truncated by the finished loop
    for r in schedulers:
        # accelerate's stepping: num_processes scheduler steps per optimizer step
        assert r == {"per_process": 8, "split": 4, "accumulate": 4, "every_call": 4, "fp16": 6}
    for r in collectives:
        assert set(r["errors"]) == {"reduce", "gather", "broadcast", "pad"}
        assert "reduce() takes tensors" in r["errors"]["reduce"]
        assert "float" in r["errors"]["reduce"] and "str" in r["errors"]["gather"]
        assert "gather_object()" in r["errors"]["pad"]
        assert r["max"] == [2.0, 5.0]
        assert [str(x) for x in r["mixed"]] == ["tensor(0)", "r0", "tensor(1)", "r1"]


def test_collectives_refuse_non_tensors_in_one_process() -> None:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    with pytest.raises(TypeError, match=r"reduce\(\) takes tensors"):
        acc.reduce(3.0)
    with pytest.raises(TypeError, match=r"gather\(\) takes tensors.*NoneType"):
        acc.gather([torch.ones(1), None])
    assert acc.reduce(torch.tensor(2.0), "max").item() == 2.0


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class SeededSampler(torch.utils.data.Sampler):  # type: ignore[type-arg]
    """A sampler with a ``seed`` (as DistributedSampler has): a permutation of seed + epoch."""

    def __init__(self, n: int) -> None:
        self.n, self.seed, self.epoch = n, torch.initial_seed(), 0  # differs per rank here

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):  # type: ignore[no-untyped-def]
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n


def _epoch(acc: Any, loader: Any) -> dict:
    local, gathered = [], []
    for batch in loader:
        local.append(batch.tolist())
        gathered += acc.gather_for_metrics(batch).tolist()
    return {"local": local, "gathered": gathered, "len": len(loader)}


def _iterables() -> dict:
    from notebook_accel.seeding import set_seed
    from notebook_accel.training.accelerator import Accelerator
    from notebook_accel.training.data.config import DataLoaderConfiguration

    acc = Accelerator()
    per_rank = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))
    split = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
    out = {
        "dispatch10": _epoch(acc, acc.prepare(DataLoader(Stream(10), batch_size=2))),
        "dispatch11": _epoch(acc, acc.prepare(DataLoader(Stream(11), batch_size=2))),
        "dispatch_drop": _epoch(
            acc, acc.prepare(DataLoader(Stream(11), batch_size=2, drop_last=True))
        ),
        "dispatch_split": _epoch(split, split.prepare(DataLoader(Stream(10), batch_size=4))),
        "per_rank": _epoch(per_rank, per_rank.prepare(DataLoader(Stream(10), batch_size=2))),
        "map_drop": _epoch(acc, acc.prepare(DataLoader(range(10), batch_size=2, drop_last=True))),
    }
    set_seed(0, device_specific=True)  # ranks' global RNGs differ
    subset = list(range(0, 40, 3))
    loader = acc.prepare(DataLoader(range(40), batch_size=2, sampler=SubsetRandomSampler(subset)))
    out["subset"] = _epoch(acc, loader)["gathered"]
    loader = acc.prepare(DataLoader(range(12), batch_size=2, sampler=SeededSampler(12)))
    out["seeded"] = [_epoch(acc, loader)["gathered"] for _ in range(2)]
    seedable = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    loader = seedable.prepare(DataLoader(range(12), batch_size=2, shuffle=True))
    out["seedable"] = [_epoch(seedable, loader)["gathered"] for _ in range(2)]
    return out


def test_iterable_datasets_drop_last_and_other_samplers() -> None:
    r0, r1 = debug_launcher(_iterables, num_processes=2)
    # dispatch: rank 0 reads; a short last round is cut evenly across the ranks
    assert r0["dispatch10"]["local"] == [[0, 1], [4, 5], [8]]
    assert r1["dispatch10"]["local"] == [[2, 3], [6, 7], [9]]
    assert r0["dispatch11"]["local"][-1] == [8, 9] and r1["dispatch11"]["local"][-1] == [10, 0]
    assert r1["dispatch_drop"]["local"] == [[2, 3], [6, 7]] and r0["dispatch_drop"]["len"] == 2
    assert r0["dispatch_split"]["local"] == [[0, 1], [4, 5], [8]]
    assert r1["dispatch_split"]["local"] == [[2, 3], [6, 7], [9]]
    # per rank: each reads the stream and keeps its slice; the last one completed from the start
    assert r0["per_rank"]["local"] == [[0, 1], [4, 5], [8, 9]]
    assert r1["per_rank"]["local"] == [[2, 3], [6, 7], [0, 1]]
    for r in (r0, r1):
        for name in ("dispatch10", "dispatch_split", "per_rank"):
            assert r[name]["gathered"] == list(range(10)), name
        assert r["dispatch11"]["gathered"] == list(range(11))
        assert r["dispatch_drop"]["gathered"] == list(range(8))
        # drop_last: the short last round is dropped, not padded
        assert r["map_drop"]["local"] in ([[0, 1], [4, 5]], [[2, 3], [6, 7]])
        assert r["map_drop"]["len"] == 2
        # a SubsetRandomSampler is kept in step across ranks: every index once
        assert sorted(r["subset"]) == list(range(0, 40, 3))
        # a sampler's own seed is rank 0's on every rank; its set_epoch is called per epoch
        assert [sorted(e) for e in r["seeded"]] == [list(range(12))] * 2
        assert r["seeded"][0] != r["seeded"][1]
        assert sorted(r["seedable"][0]) == list(range(12)) != r["seedable"][0]
        assert r["seedable"][0] != r["seedable"][1]


def _uneven() -> dict:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(1, 1))
    opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(10.0)[:, None]), batch_size=2))
    with acc.join_uneven_inputs([model], even_batches=False):
        inside = len(loader)
        steps = 0
        for (x,) in loader:
            acc.backward(model(x).sum())
            opt.step()
            opt.zero_grad()
            steps += 1
    return {"inside": inside, "steps": steps, "after": len(loader)}


def test_join_uneven_inputs() -> None:
    r0, r1 = debug_launcher(_uneven, num_processes=2)
    assert (r0["steps"], r1["steps"]) == (3, 2)  # DDP's Join shadowed rank 1's missing step
    assert (r0["inside"], r1["inside"]) == (3, 2)
    assert r0["after"] == r1["after"] == 3  # even_batches restored


def test_iterable_dataset_in_one_process_is_the_plain_loader() -> None:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    loader = acc.prepare(DataLoader(Stream(5), batch_size=2))
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]] and len(loader) == 3


def test_dataloader_configuration_is_checked() -> None:
    from notebook_accel import DataLoaderConfiguration
    from notebook_accel.errors import ConfigError
    from notebook_accel.training.accelerator import Accelerator

    config = DataLoaderConfiguration(split_batches=True, even_batches=False)
    acc = Accelerator(dataloader_config=config)
    assert acc.split_batches and not acc.even_batches and acc.dataloader_config is config
    with pytest.raises(ConfigError, match="dataloader_config"):
        Accelerator(split_batches=True, dataloader_config=config)
    with pytest.raises(ConfigError, match="dispatch_batches"):
        DataLoaderConfiguration(dispatch_batches="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="step_scheduler_with_optimizer"):
        Accelerator(step_scheduler_with_optimizer="no")  # type: ignore[arg-type]


def test_skip_first_batches_of_a_plain_loader() -> None:
    from notebook_accel import skip_first_batches
    from notebook_accel.errors import ConfigError

    loader = DataLoader(range(10), batch_size=3)
    skipped = skip_first_batches(loader, 2)
    assert [b.tolist() for b in skipped] == [[6, 7, 8], [9]] and len(skipped) == 2
    stream = skip_first_batches(DataLoader(Stream(5), batch_size=2), 1)
    assert [b.tolist() for b in stream] == [[2, 3], [4]]
    with pytest.raises(ConfigError, match="num_batches"):
        skip_first_batches(loader, -1)
