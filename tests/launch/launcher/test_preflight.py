"""Bad input is refused in the parent, before any process starts, with a precise message."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest

from notebook_accel import ConfigError, PayloadError, notebook_launcher
from notebook_accel.config import LaunchConfig
from notebook_accel.hardware import Machine
from notebook_accel.launch import launch
from tests.launch.helpers import worker_processes


def _noop() -> None:
    return None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize(
    ("kwargs", "parameter", "accepted"),
    [
        ({"num_processes": 0}, "num_processes", "an int >= 1"),
        ({"num_processes": "2"}, "num_processes", "an int >= 1"),
        ({"num_processes": True}, "num_processes", "an int >= 1"),
        ({"mixed_precision": "fp32"}, "mixed_precision", "'no', 'fp16', 'bf16'"),
        ({"hardware": "gpu"}, "hardware", "'auto', 'cpu', 'cuda', 'tpu', 'mps'"),
        pytest.param(
            {"hardware": "cuda"},
            "hardware",
            "hardware this machine has",
            marks=pytest.mark.skipif(_has_cuda(), reason="this machine has CUDA GPUs"),
        ),
        ({"output": "rank0"}, "output", "'all', 'main', 'none'"),
        ({"timeout": -1}, "timeout", "a number of seconds > 0"),
        ({"args": 5}, "args", "a tuple of positional arguments"),
        ({"args": [1, 2]}, "args", "a tuple"),
        ({"function": 42}, "function", "a callable"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps", "an int >= 1"),
        ({"node_rank": 2, "num_nodes": 2, "master_port": 29500}, "node_rank", "[0, 1]"),
        ({"use_port": "http"}, "use_port", "a TCP port number"),
        ({"dynamo_backend": "inductr"}, "dynamo_backend", "'inductor', 'aot_ts_nvfuser'"),
        ({"dynamo_backend": "inductor", "fsdp": "full"}, "dynamo_backend", "'no' with FSDP"),
    ],
)
def test_bad_arguments_name_parameter_value_and_accepted(
    kwargs: dict[str, Any], parameter: str, accepted: str
) -> None:
    function: Any = kwargs.pop("function", _noop)
    args = kwargs.pop("args", ())
    with pytest.raises(ConfigError) as info:
        notebook_launcher(function, args, **kwargs)
    assert info.value.parameter == parameter
    assert parameter in str(info.value) and accepted in str(info.value)
    assert worker_processes() == []


def test_bounds_follow_the_hardware() -> None:
    two_gpus = Machine(cpu_cores=8, cuda_names=("NVIDIA H100",) * 2, cuda_bf16=False)
    with pytest.raises(ConfigError, match=r"num_processes=4 .*\[1, 2\] on CUDA, 2 × H100"):
        launch(_noop, (), None, LaunchConfig(num_processes=4), two_gpus)
    with pytest.raises(ConfigError, match=r"mixed_precision='bf16'.*'no', 'fp16'"):
        launch(_noop, (), None, LaunchConfig(mixed_precision="bf16"), two_gpus)
    mps = Machine(cpu_cores=8, mps=True)
    with pytest.raises(ConfigError, match=r"num_processes=2 .*\[1, 1\] on Apple MPS"):
        launch(_noop, (), None, LaunchConfig(num_processes=2), mps)


class _Holder:
    def __init__(self) -> None:
        self.name = "fine"
        self.conn = socket.socket()


@pytest.mark.parametrize(
    ("make", "culprit"),
    [
        (lambda lock: (lambda: lock.acquire(), ()), "variable 'lock' (captured by"),
        (lambda lock: (_noop, ((x for x in range(3)),)), "args[0] (a generator)"),
        (
            lambda lock: (_noop, ({"model": 1, "sock": socket.socket()},)),
            "args[0]['sock'] (a socket.socket)",
        ),
        (lambda lock: (_noop, (_Holder(),)), "args[0].conn (a socket.socket)"),
    ],
)
def test_unpicklable_payload_names_the_culprit(
    make: Callable[[Any], tuple[Callable[..., Any], tuple[Any, ...]]], culprit: str
) -> None:
    function, args = make(threading.Lock())
    with pytest.raises(PayloadError) as info:
        notebook_launcher(function, args, num_processes=2, hardware="cpu")
    assert culprit in str(info.value), str(info.value)
    assert info.value.culprit.startswith(culprit.split(" (")[0])
    assert worker_processes() == []
