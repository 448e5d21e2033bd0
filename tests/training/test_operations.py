"""accelerate.utils's free functions in one process, next to accelerate's own answers
(the multi-process ones run in tests/training/test_accelerate_paths_port.py)."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch

from notebook_accel.training import operations

Pair = namedtuple("Pair", ["a", "b"])


class OnlyDevice:
    """A batch-like object whose .to takes no non_blocking (a TypeError with it)."""

    def __init__(self) -> None:
        self.moved_to: Any = None

    def to(self, device: Any) -> OnlyDevice:
        self.moved_to = device
        return self


def _shape(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.device.type, value.tolist())
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_shape(v) for v in value])
    if isinstance(value, OnlyDevice):
        return ("only-device", str(value.moved_to))
    return value


def test_send_to_device_as_accelerates() -> None:
    theirs = pytest.importorskip("accelerate.utils")
    t = torch.tensor([1.0, 2.0])

    def batch() -> dict[str, Any]:
        return {"x": t, "pair": Pair(t, [t, 3]), "odd": OnlyDevice(), "keep": t, "s": "text"}

    for skip in (None, "keep", ["keep", "x"]):
        ours = operations.send_to_device(batch(), "cpu", non_blocking=True, skip_keys=skip)
        want = theirs.send_to_device(batch(), "cpu", non_blocking=True, skip_keys=skip)
        assert _shape(ours) == _shape(want)
        assert type(ours["pair"]) is Pair


def test_extract_model_from_parallel_keeps_or_drops_the_compile() -> None:
    theirs = pytest.importorskip("accelerate.utils")
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model)
    for keep in (True, False):
        ours = operations.extract_model_from_parallel(compiled, keep_torch_compile=keep)
        want = theirs.extract_model_from_parallel(compiled, keep_torch_compile=keep)
        assert ours is want
    assert operations.extract_model_from_parallel(compiled) is compiled
    assert operations.extract_model_from_parallel(compiled, keep_torch_compile=False) is model


def test_the_collectives_in_one_process_as_accelerates() -> None:
    theirs = pytest.importorskip("accelerate.utils")
    data = {"a": torch.tensor([1.0, 3.0]), "b": [torch.ones(2, 1)]}
    for name, args in (
        ("gather", ()),
        ("reduce", ()),
        ("reduce", ("sum", 2.0)),
        ("reduce", ("none",)),
        ("broadcast", ()),
        ("pad_across_processes", (0, -1)),
    ):
        ours = getattr(operations, name)(data, *args)
        want = getattr(theirs, name)(data, *args)
        assert _shape(ours) == _shape(want), name
    assert operations.broadcast_object_list([1, "a"]) == theirs.broadcast_object_list([1, "a"])
    for value in ([1, 2], "x", (3,)):
        assert operations.gather_object(object=value) == theirs.gather_object(object=value)
    operations.wait_for_everyone()
