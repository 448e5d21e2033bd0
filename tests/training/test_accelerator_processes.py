"""The Accelerator's process helpers and options on 2 real gloo processes (one launch).

Covers accelerate's names: ``main_process_first``/``local_main_process_first`` (order, asserted
from a shared file), ``print`` (exactly once), the ``on_*`` decorators in their call and
decorate forms, ``is_last_process``, ``set_trigger``/``check_trigger``,
``trigger_sync_in_backward``, ``PartialState``, the ``prepare_*`` methods, ``free_memory`` and
the ``kwargs_handlers`` for DDP and the process group.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from notebook_accel import (
    ConfigError,
    DistributedDataParallelKwargs,
    InitProcessGroupKwargs,
    PartialState,
    debug_launcher,
)


class _PartlyUsed(torch.nn.Module):
    """A model with a parameter that forward never uses (DDP needs find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)  # type: ignore[no-any-return]


def _goes_first(acc: Any, folder: Path, which: str) -> None:
    """Each rank notes entering and leaving the block; the first one lingers inside."""
    log = folder / f"{which}.log"
    first = acc.is_main_process if which == "main" else acc.is_local_main_process
    with getattr(acc, f"{which}_process_first")():
        with log.open("a") as f:
            f.write(f"enter {acc.process_index}\n")
        if first:
            time.sleep(0.3)  # a block without the barrier would let rank 1 in meanwhile
        with log.open("a") as f:
            f.write(f"leave {acc.process_index}\n")


def _decorated(acc: Any) -> dict[str, Any]:
    r: dict[str, Any] = {}

    @acc.on_process(process_index=1)
    def on_one() -> str:
        return "ran"

    @acc.on_local_process(local_process_index=0)
    def on_local_zero() -> str:
        return "ran"

    @acc.on_last_process
    def on_last() -> str:
        return "ran"

    @acc.on_main_process
    def on_main(x: int) -> int:
        return x + 1

    r["on_process"] = on_one()
    r["on_process_call"] = acc.on_process(lambda: "ran", process_index=0)()
    r["on_local_process"] = on_local_zero()
    r["on_last_process"] = on_last()
    r["on_main_process"] = on_main(1)
    r["on_local_main_process"] = acc.on_local_main_process(lambda: "ran")()
    return r


def _processes(folder: Path) -> dict[str, Any]:
    from datetime import timedelta

    import torch.distributed as dist

    from notebook_accel.training.accelerator import Accelerator

    group_file = folder / "group"
    acc = Accelerator(
        kwargs_handlers=[
            InitProcessGroupKwargs(init_method=group_file.as_uri(), timeout=timedelta(seconds=77)),
            DistributedDataParallelKwargs(
                find_unused_parameters=True, bucket_cap_mb=1, comm_hook="fp16"
            ),
        ]
    )
    rank = acc.process_index
    r: dict[str, Any] = {"rank": rank}
    world = dist.group.WORLD
    assert world is not None
    r["group_timeout"] = world._get_backend(torch.device("cpu")).options._timeout
    r["group_file_used"] = group_file.exists()

    _goes_first(acc, folder, "main")
    _goes_first(acc, folder, "local_main")
    acc.print("printed once")
    r.update(_decorated(acc))
    r["is_last_process"] = acc.is_last_process

    state = PartialState()
    r["partial"] = (
        state.process_index,
        state.num_processes,
        state.local_process_index,
        str(state.device),
        state.is_main_process,
        state.is_local_main_process,
        state.is_last_process,
        str(state.distributed_type),
        state.use_distributed,
        state.backend,
    )
    r["partial_on_last"] = state.on_last_process(lambda: "ran")()
    with state.split_between_processes([1, 2, 3]) as mine:
        r["partial_split"] = mine
    r["state_aliases"] = (acc.state.process_index, acc.state.num_processes)

    # set_trigger on one rank, seen by every rank at the next check, then reset.
    r["trigger_unset"] = acc.check_trigger()
    if rank == 1:
        acc.set_trigger()
    r["trigger_set"] = acc.check_trigger()
    r["trigger_after"] = acc.check_trigger()

    # DDP built with the handler's options; an unused parameter needs find_unused_parameters.
    torch.manual_seed(0)
    model = acc.prepare_model(_PartlyUsed())
    ddp = model._get_ddp_logging_data()
    r["ddp"] = (ddp.get("comm_hook"), model.find_unused_parameters, model.bucket_bytes_cap)
    opt = acc.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    sched = acc.prepare_scheduler(torch.optim.lr_scheduler.StepLR(opt.optimizer, 1, 0.5))
    for _ in range(2):
        acc.backward(model(torch.full((1, 2), float(rank))).sum())
        opt.step()
        sched.step()
        opt.zero_grad()
    r["trained_with_unused"] = model.module.used.weight.detach().clone()
    r["scheduler"] = type(sched).__name__
    r["eval_model"] = type(acc.prepare_model(torch.nn.Linear(2, 2), evaluation_mode=True)).__name__
    loader = torch.utils.data.DataLoader(torch.arange(4.0), batch_size=1)
    r["loader"] = [b.tolist() for b in acc.prepare_data_loader(loader, device_placement=False)]

    # trigger_sync_in_backward: two forwards under no_sync, the second backward all-reduces
    # (a second Accelerator, with plain DDP options; it reuses the process group).
    plain = Accelerator()
    torch.manual_seed(0)
    net = plain.prepare(torch.nn.Linear(2, 1, bias=False))
    x = torch.full((1, 2), float(rank + 1))
    with plain.no_sync(net):
        loss_a, loss_b = net(x).sum(), (2 * net(x)).sum()
    plain.backward(loss_a)
    r["grad_unsynced"] = net.module.weight.grad.clone()
    with plain.trigger_sync_in_backward(net):
        plain.backward(loss_b)
    r["grad_synced"] = net.module.weight.grad.clone()
    del loss_a, loss_b

    # free_memory drops the Accelerator's references: the objects can then be collected.
    import weakref

    probe = weakref.ref(net.module)
    net = plain.free_memory(net)[0]
    r["freed"] = (probe() is None, net, plain.step, len(plain._objects.model))
    acc.wait_for_everyone()
    return r


def test_process_helpers_and_handlers_on_two_processes(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    r0, r1 = debug_launcher(_processes, args=(tmp_path,), num_processes=2)
    out, _ = capfd.readouterr()
    for which in ("main", "local_main"):
        order = (tmp_path / f"{which}.log").read_text().splitlines()
        assert order == ["enter 0", "leave 0", "enter 1", "leave 1"], which
    assert [line for line in out.splitlines() if "printed once" in line] == [
        "[rank 0] printed once"
    ]
    for r in (r0, r1):
        assert r["group_timeout"].total_seconds() == 77 and r["group_file_used"]
        assert r["ddp"] == ("fp16_compress_hook", True, 1024 * 1024)
        assert r["scheduler"] == "AcceleratedScheduler"
        assert r["eval_model"] == "Linear"
        assert (r["trigger_unset"], r["trigger_set"], r["trigger_after"]) == (False, True, False)
        assert r["state_aliases"] == (r["rank"], 2)
        assert r["freed"] == (True, None, 0, 0)
    assert torch.equal(r0["trained_with_unused"], r1["trained_with_unused"])  # in step
    assert (r0["on_process"], r1["on_process"]) == (None, "ran")
    assert (r0["on_process_call"], r1["on_process_call"]) == ("ran", None)
    assert (r0["on_local_process"], r1["on_local_process"]) == ("ran", None)
    assert (r0["on_last_process"], r1["on_last_process"]) == (None, "ran")
    assert (r0["on_main_process"], r1["on_main_process"]) == (2, None)
    assert (r0["on_local_main_process"], r1["on_local_main_process"]) == ("ran", None)
    assert (r0["is_last_process"], r1["is_last_process"]) == (False, True)
    assert r0["partial"] == (
        0,
        2,
        0,
        "cpu",
        True,
        True,
        False,
        "DistributedType.MULTI_CPU",
        True,
        "gloo",
    )
    assert r1["partial"] == (
        1,
        2,
        1,
        "cpu",
        False,
        False,
        True,
        "DistributedType.MULTI_CPU",
        True,
        "gloo",
    )
    assert (r0["partial_on_last"], r1["partial_on_last"]) == (None, "ran")
    assert (r0["partial_split"], r1["partial_split"]) == ([1, 2], [3])
    assert (r0["loader"], r1["loader"]) == ([[0.0], [2.0]], [[1.0], [3.0]])
    # no_sync: each rank its own gradient (x = rank + 1); triggered: the mean of 3x over ranks
    assert r0["grad_unsynced"].tolist() == [[1.0, 1.0]]
    assert r1["grad_unsynced"].tolist() == [[2.0, 2.0]]
    for r in (r0, r1):
        assert r["grad_synced"].tolist() == [[4.5, 4.5]]


def test_single_process_forms() -> None:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    assert acc.is_last_process and acc.is_main_process
    # one process: every decorated function runs, as under accelerate
    assert acc.on_process(lambda: "ran", process_index=3)() == "ran"
    assert acc.on_last_process(lambda: "ran")() == "ran"
    with pytest.raises(ConfigError, match="process_index"):
        acc.on_process(lambda: 1, process_index=None)
    with pytest.raises(ConfigError, match="function"):
        acc.on_main_process()
    state = PartialState()
    assert (state.num_processes, state.backend, state.distributed_type) == (1, None, "NO")
    assert not acc.check_trigger()
    acc.set_trigger()
    assert acc.check_trigger() and not acc.check_trigger()
    model = acc.prepare_model(torch.nn.Linear(2, 2))
    assert acc.prepare_model(model) is model and acc._objects.model == [model]
    assert acc.free_memory(model) == [None] and acc._objects.model == []
    with acc.trigger_sync_in_backward(torch.nn.Linear(1, 1)):  # no DDP: a no-op
        pass


def test_ddp_options_in_both_places_are_refused() -> None:
    from notebook_accel.training.accelerator import Accelerator

    handler = DistributedDataParallelKwargs(find_unused_parameters=True)
    with pytest.raises(ConfigError, match="ddp_kwargs"):
        Accelerator(ddp_kwargs={"find_unused_parameters": False}, kwargs_handlers=[handler])
    both = Accelerator(ddp_kwargs={"static_graph": True}, kwargs_handlers=[handler])
    assert both.ddp_kwargs == {"find_unused_parameters": True, "static_graph": True}


def test_accelerate_utils_names_are_reachable() -> None:
    import notebook_accel
    from notebook_accel import utils

    for name in ("InitProcessGroupKwargs", "find_executable_batch_size", "set_seed"):
        assert getattr(utils, name) is getattr(notebook_accel, name)
    with pytest.raises(ImportError):
        exec("from notebook_accel.utils import not_a_name")


def test_handler_values_are_checked() -> None:
    with pytest.raises(ConfigError, match="timeout"):
        InitProcessGroupKwargs(timeout=600)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="comm_hook") as err:
        DistributedDataParallelKwargs(comm_hook="fp8")
    assert "'power_sgd'" in err.value.accepted
    assert DistributedDataParallelKwargs(comm_hook="bf16").to_kwargs() == {}  # hooks aside
