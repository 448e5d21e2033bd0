"""Collectives, metrics gathering and data sharding on 2 real processes (one launch)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import debug_launcher


def _gathered_ids(acc: object, loader: object, as_objects: bool = False) -> list[int]:
    out: list[int] = []
    for (idx,) in loader:  # type: ignore[attr-defined]
        if as_objects:
            out += acc.gather_for_metrics([f"s{i}" for i in idx.tolist()])  # type: ignore[attr-defined]
        else:
            out += acc.gather_for_metrics(idx).tolist()  # type: ignore[attr-defined]
    return out


def _everything() -> dict:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    nine = TensorDataset(torch.arange(9))
    r: dict = {"rank": acc.process_index}
    r["plain"] = _gathered_ids(acc, acc.prepare(DataLoader(nine, batch_size=2)))
    shuffled = acc.prepare(DataLoader(nine, batch_size=2, shuffle=True))
    r["shuffled"] = [_gathered_ids(acc, shuffled) for _ in range(2)]  # two epochs
    r["objects"] = _gathered_ids(acc, acc.prepare(DataLoader(nine, batch_size=2)), True)
    r["local_batches"] = [idx.tolist() for (idx,) in acc.prepare(DataLoader(nine, batch_size=2))]

    split = Accelerator(split_batches=True)
    loader = split.prepare(DataLoader(nine, batch_size=4))
    r["split_sizes"] = [len(idx) for (idx,) in loader]
    r["split"] = _gathered_ids(split, loader)

    uneven = Accelerator(even_batches=False)
    r["uneven_len"] = len(uneven.prepare(DataLoader(nine, batch_size=2)))

    rank = acc.process_index
    r["gather_nested"] = acc.gather({"a": torch.tensor([rank]), "b": (torch.tensor(rank),)})
    r["reduce"] = (acc.reduce(torch.tensor(float(rank + 1))), acc.reduce(torch.tensor(3.0), "mean"))
    r["broadcast"] = acc.broadcast(torch.tensor([rank + 10]), from_process=1)
    # a training loss gathered for metrics outside no_grad (accelerate's autoregressive
    # gradient accumulation example): gloo's all_gather_single refuses it, all_gather does not
    loss = (torch.ones(2, requires_grad=True) * (rank + 1)).sum()
    graded = acc.gather_for_metrics(loss.repeat(3))
    r["gather_graded"] = (graded.tolist(), graded.requires_grad)
    padded = acc.pad_across_processes(torch.ones(rank + 1), pad_index=-1)
    r["padded"] = acc.gather(padded).tolist()
    r["pad_first"] = acc.pad_across_processes(torch.ones(rank + 1), pad_first=True).tolist()
    r["objects_gathered"] = acc.gather_object([{"rank": rank}])
    with acc.split_between_processes(list("abcde")) as mine:
        r["split_list"] = mine
    with acc.split_between_processes({"x": [1, 2, 3]}, apply_padding=True) as mine:
        r["split_dict"] = mine

    # main_process_first's order and print's "exactly once": test_accelerator_processes.py
    r["only_main"] = acc.on_main_process(lambda: "ran")()
    r["only_local_main"] = acc.on_local_main_process(lambda: "ran")()
    acc.wait_for_everyone()
    acc.end_training()
    import torch.distributed as dist

    r["group_left"] = not dist.is_initialized()
    return r


def test_collectives_and_metrics_on_two_processes() -> None:
    r0, r1 = debug_launcher(_everything, num_processes=2)
    for r in (r0, r1):
        # 9 samples on 2 ranks: exactly those 9, the padding of the last round dropped
        assert r["plain"] == list(range(9))
        assert all(sorted(epoch) == list(range(9)) for epoch in r["shuffled"])
        assert r["shuffled"][0] != r["shuffled"][1]  # a new permutation every epoch
        assert r["objects"] == [f"s{i}" for i in range(9)]
        assert r["split"] == list(range(9)) and r["split_sizes"] == [2, 2, 2]
        assert r["gather_nested"]["a"].tolist() == [0, 1]
        assert r["gather_nested"]["b"][0].tolist() == [0, 1]
        assert [t.item() for t in r["reduce"]] == [3.0, 3.0]
        assert r["broadcast"].tolist() == [11]
        assert r["padded"] == [1.0, -1.0, 1.0, 1.0]
        assert r["gather_graded"] == ([2.0] * 3 + [4.0] * 3, False)
        assert r["objects_gathered"] == [{"rank": 0}, {"rank": 1}]
        assert r["group_left"]
    assert r0["shuffled"] == r1["shuffled"]  # both ranks agree on the order
    # each rank its own batches; even_batches completes rank 1's last one from the start
    assert r0["local_batches"] == [[0, 1], [4, 5], [8, 0]]
    assert r1["local_batches"] == [[2, 3], [6, 7], [1, 2]]
    assert (r0["uneven_len"], r1["uneven_len"]) == (3, 2)
    assert r1["pad_first"] == [1.0, 1.0] and r0["pad_first"] == [0.0, 1.0]
    assert (r0["split_list"], r1["split_list"]) == (["a", "b", "c"], ["d", "e"])
    assert (r0["split_dict"], r1["split_dict"]) == ({"x": [1, 2]}, {"x": [3, 3]})
    assert (r0["only_main"], r1["only_main"]) == ("ran", None)
    assert (r0["only_local_main"], r1["only_local_main"]) == ("ran", None)
