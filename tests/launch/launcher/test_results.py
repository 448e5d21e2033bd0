"""Results, environment and payload travel: real worker processes on CPU/gloo."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from notebook_accel import debug_launcher, notebook_launcher


def _rank_times(x: int, scale: int = 1) -> int:
    return int(os.environ["RANK"]) * x * scale


def test_returns_every_rank_value_in_rank_order() -> None:
    assert notebook_launcher(_rank_times, args=(10,), num_processes=3, hardware="cpu") == [
        0,
        10,
        20,
    ]
    assert debug_launcher(_rank_times, args=(5,), num_processes=2, kwargs={"scale": 3}) == [0, 15]


def test_lambdas_and_closures_travel_by_value() -> None:
    offset = 7
    table = {"a": [1, 2]}

    def closure() -> int:  # defined here: cloudpickle must send it by value
        return offset + len(table["a"]) + int(os.environ["RANK"])

    assert debug_launcher(closure, num_processes=2) == [9, 10]
    assert debug_launcher(lambda: "x" * 3, num_processes=1) == ["xxx"]


def _distributed_view() -> dict[str, object]:
    import torch
    import torch.distributed as dist

    dist.init_process_group()  # env:// with no arguments must just work
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    keys = (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NOTEBOOK_ACCEL_MIXED_PRECISION",
        "SET_IN_CELL",
    )
    return {
        "sum": t.item(),
        "backend": dist.get_backend_config(),
        **{k: os.environ.get(k) for k in keys},
    }


def test_workers_get_the_torch_distributed_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    debug_launcher(_rank_times, args=(1,), num_processes=1)  # the forkserver is already up
    monkeypatch.setenv("SET_IN_CELL", "yes")  # set after the forkserver started
    views = notebook_launcher(
        _distributed_view, num_processes=2, mixed_precision="bf16", hardware="cpu"
    )
    assert [v["RANK"] for v in views] == ["0", "1"]
    assert [v["LOCAL_RANK"] for v in views] == ["0", "1"]
    for view in views:
        assert view["sum"] == 3.0
        assert "gloo" in str(view["backend"])
        assert view["WORLD_SIZE"] == view["LOCAL_WORLD_SIZE"] == "2"
        assert view["MASTER_ADDR"] == "127.0.0.1"
        assert int(view["MASTER_PORT"]) > 0  # type: ignore[arg-type]
        assert view["NOTEBOOK_ACCEL_MIXED_PRECISION"] == "bf16"
        assert view["SET_IN_CELL"] == "yes"


def test_sys_path_and_working_directory_travel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "user_helpers.py").write_text(
        textwrap.dedent("""
        import os
        def where():
            return os.getcwd(), open("data.txt").read()
    """)
    )
    (tmp_path / "data.txt").write_text("local file")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import user_helpers  # by reference: the worker must import it from the same sys.path

    assert (
        debug_launcher(user_helpers.where, num_processes=2) == [(str(tmp_path), "local file")] * 2
    )
    sys.modules.pop("user_helpers", None)


def test_tensors_come_back_by_value() -> None:
    def make() -> object:
        import torch

        return torch.arange(4) * (int(os.environ["RANK"]) + 1)

    import torch

    results = debug_launcher(make, num_processes=2)
    assert torch.equal(results[0], torch.arange(4))
    assert torch.equal(results[1], torch.arange(4) * 2)


def test_sys_exit_zero_is_a_clean_finish() -> None:
    assert debug_launcher(lambda: sys.exit(0), num_processes=2) == [None, None]


def test_omp_num_threads_set_after_the_first_launch_applies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def threads() -> int:
        import torch

        return torch.get_num_threads()

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    debug_launcher(threads, num_processes=2)  # the forkserver runs, its OpenMP set up
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # a later cell sets it
    assert debug_launcher(threads, num_processes=2) == [3, 3]


def test_a_data_loader_with_workers_over_a_cell_defined_dataset() -> None:
    import torch

    class Squares(torch.utils.data.Dataset):  # travels by value, as a notebook cell's class
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> int:
            return i * i

    def load() -> tuple[str, list[int]]:
        import multiprocessing

        loader = torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=2)
        return multiprocessing.get_start_method(), [int(b.sum()) for b in loader]

    # Workers start their loader's processes as a plain (or torchrun) process does: fork.
    assert debug_launcher(load, num_processes=2) == [("fork", [14, 126])] * 2
