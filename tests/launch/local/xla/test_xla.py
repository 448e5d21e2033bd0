"""The TPU path (launch/local/xla/engine.py) on torch_xla's CPU runtime, in its own environment.

torch_xla pins its own torch version, so these tests run only where torch_xla is installed,
e.g. a separate virtual environment:

    python -m venv /work/xla-venv
    /work/xla-venv/bin/pip install torch==2.9.0 torch_xla==2.9.0 cloudpickle tqdm pytest numpy
    PYTHONPATH=. /work/xla-venv/bin/python -m pytest tests/launch/local/xla/test_xla.py

PJRT_DEVICE=CPU with CPU_NUM_DEVICES=N gives N XLA devices in one process (one thread each),
so this checks the payload, the results and the errors; not collectives, not TPU topology.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch_xla", reason="torch_xla is not installed (see this file's docstring)")

from notebook_accel import env, launched  # noqa: E402
from notebook_accel.config import LaunchConfig  # noqa: E402
from notebook_accel.hardware import Machine  # noqa: E402
from notebook_accel.launch import launch  # noqa: E402

# A machine that says it has 2 TPU cores; PJRT_DEVICE=CPU makes torch_xla use CPU devices.
FAKE_TPU = Machine(cpu_cores=2, tpu_cores=2, tpu_type="v-cpu-runtime")


@pytest.fixture(autouse=True)
def _cpu_runtime() -> Any:
    with env.overridden({"PJRT_DEVICE": "CPU"}):
        yield


def test_cell_function_runs_on_every_xla_device() -> None:
    offset = 10.0  # captured: the function travels by value, as from a notebook cell

    def train(scale: float) -> tuple[int, int, list[float], str]:
        import torch
        import torch_xla
        import torch_xla.runtime as xr

        device = torch_xla.device()
        t = torch.full((2,), (xr.global_ordinal() + 1) * scale).to(device)
        out = (t * 2 + offset).cpu()  # computed on the XLA device
        # No collective here: on torch_xla 2.9's CPU runtime even plain xmp.spawn aborts in a
        # two-device all_reduce (XLA rendezvous op_id mismatch), so that is not testable here.
        return xr.global_ordinal(), xr.world_size(), out.tolist(), device.type

    config = LaunchConfig(hardware="tpu", num_processes=2)
    results = launch(train, (2.0,), None, config, machine=FAKE_TPU)
    assert results == [(0, 2, [14.0, 14.0], "xla"), (1, 2, [18.0, 18.0], "xla")]


def test_a_failing_device_raises_its_own_exception_with_the_traceback() -> None:
    def train() -> None:
        import torch_xla.runtime as xr

        if xr.global_ordinal() == 1:
            raise KeyError("no such column on device 1")

    config = LaunchConfig(hardware="tpu", num_processes=2)
    with pytest.raises(KeyError, match="no such column") as info:
        launch(train, (), None, config, machine=FAKE_TPU)
    assert "Traceback from rank 1" in str(info.value.__cause__)
    assert "raised on rank 1 of 2" in "".join(info.value.__notes__)


def test_launch_options_reach_the_devices() -> None:
    def options() -> tuple[str | None, str | None]:
        return launched.device_type(), launched.option("mixed_precision")

    config = LaunchConfig(hardware="tpu", num_processes=2, mixed_precision="bf16")
    assert launch(options, (), None, config, machine=FAKE_TPU) == [("xla", "bf16")] * 2


def test_every_device_output_reaches_the_cell_with_its_rank(capfd: Any) -> None:
    def train() -> None:
        import ctypes
        import os
        import sys

        import torch_xla.runtime as xr

        rank = xr.global_ordinal()
        print(f"python print {rank}")
        print(f"python error {rank}", file=sys.stderr)
        os.write(1, f"fd write {rank}\n".encode())
        ctypes.CDLL(None).printf(f"C printf {rank}\n".encode())

    config = LaunchConfig(hardware="tpu", num_processes=2)
    launch(train, (), None, config, machine=FAKE_TPU)
    out, err = capfd.readouterr()
    # The CPU runtime holds both devices in one process (a thread each, as TPU v2/v3 do):
    # Python's print is told apart by thread; C and fd writes carry the process's ranks.
    for rank in (0, 1):
        assert f"[rank {rank}] python print {rank}\n" in out
        assert f"[rank {rank}] python error {rank}\n" in err
        assert f"[ranks 0-1] fd write {rank}\n" in out
        assert f"[ranks 0-1] C printf {rank}\n" in out


def test_one_device_per_process_prefixes_c_output_with_its_rank(capfd: Any) -> None:
    def train() -> None:
        import os

        os.write(1, b"fd write\n")
        print("python print")

    config = LaunchConfig(hardware="tpu", num_processes=1)
    launch(train, (), None, config, machine=FAKE_TPU)
    out, _ = capfd.readouterr()
    assert "[rank 0] fd write\n" in out
    assert "[rank 0] python print\n" in out


def test_timeout_stops_the_xla_processes() -> None:
    import time

    from notebook_accel.errors import LaunchTimeoutError

    def train() -> None:
        import time

        time.sleep(120)

    config = LaunchConfig(hardware="tpu", num_processes=2, timeout=8)
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError):
        launch(train, (), None, config, machine=FAKE_TPU)
    assert time.monotonic() - start < 60


def test_the_panel_stop_event_stops_the_xla_processes() -> None:
    import threading
    import time

    stop = threading.Event()
    threading.Timer(5.0, stop.set).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="stopped from the launch panel"):
        launch(time.sleep, (300,), None, LaunchConfig(hardware="tpu"), FAKE_TPU, stop=stop)
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_accelerator_trains_on_the_xla_device(precision: str) -> None:
    # One device: torch_xla 2.9's CPU runtime aborts in any two-device collective (see the
    # first test), so gather/reduce/DDP across devices are not verified here.
    def train() -> tuple[str, int, str, str, list[float], list[float], float]:
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        from notebook_accel import Accelerator

        acc = Accelerator()
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=4))
        losses = []
        for _ in range(3):
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            losses.append(loss.item())
        gathered = acc.gather(torch.tensor([acc.process_index + 1.0], device=acc.device))
        reduced = acc.reduce(torch.tensor(2.0, device=acc.device), "mean")
        return (
            str(acc.device),
            acc.num_processes,
            next(model.parameters()).device.type,
            acc.mixed_precision,
            losses,
            gathered.cpu().tolist(),
            reduced.cpu().item(),
        )

    config = LaunchConfig(hardware="tpu", num_processes=1, mixed_precision=precision)
    [(device, world, param_device, mixed, losses, gathered, reduced)] = launch(
        train, (), None, config, machine=FAKE_TPU
    )
    assert (device, world, param_device, mixed) == ("xla:0", 1, "xla", precision)
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
    assert gathered == [1.0] and reduced == 2.0


def test_fp16_is_refused_on_xla() -> None:
    def train() -> None:
        from notebook_accel import Accelerator

        Accelerator(mixed_precision="fp16")

    from notebook_accel.errors import ConfigError

    config = LaunchConfig(hardware="tpu", num_processes=1)
    with pytest.raises(ConfigError, match="mixed_precision='fp16'.*'no', 'bf16' on TPU"):
        launch(train, (), None, config, machine=FAKE_TPU)


def test_prepared_optimizer_steps_the_device_parameters() -> None:
    def train() -> bool:
        import torch

        from notebook_accel import Accelerator

        acc = Accelerator()
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = acc.prepare(model, opt)
        before = model.weight.detach().cpu().clone()
        acc.backward(model(torch.ones(1, 2, device=acc.device)).sum())
        opt.step()
        return not torch.equal(before, model.weight.detach().cpu())

    config = LaunchConfig(hardware="tpu", num_processes=1)
    assert launch(train, (), None, config, machine=FAKE_TPU) == [True]
