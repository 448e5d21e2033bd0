"""accelerate 1.16's big-model parameters, beside accelerate 1.16: tied weights placed once
(``set_module_tensor_to_device(tied_params_map=)``, ``AlignDevicesHook(tied_params_map=)``),
and ``load_checkpoint_in_model(broadcast_from_rank0=)`` where rank 0 alone reads the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from notebook_accel import debug_launcher

accelerate = pytest.importorskip("accelerate")


def _tied_placements(set_tensor: Any) -> tuple[bool, bool, list[str], bool]:
    """Two modules given one offloaded tensor as their weight, through a tied map."""
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    value = torch.ones(2, 2)
    tied: dict[int, dict[Any, torch.Tensor]] = {value.data_ptr(): {}}
    set_tensor(first, "weight", "cpu", value=value, tied_params_map=tied, clear_cache=False)
    set_tensor(second, "weight", "cpu", value=value, tied_params_map=tied, non_blocking=True)
    untied = torch.nn.Linear(2, 2)
    set_tensor(untied, "weight", "cpu", value=torch.ones(2, 2), tied_params_map=tied)
    return (
        second.weight is first.weight,
        isinstance(second.weight, torch.nn.Parameter),
        [str(d) for d in tied[value.data_ptr()]],
        untied.weight is first.weight,
    )


def test_a_tied_weight_is_placed_once_per_device() -> None:
    from accelerate.utils import set_module_tensor_to_device as theirs

    from notebook_accel.utils import set_module_tensor_to_device as ours

    assert _tied_placements(ours) == _tied_placements(theirs) == (True, True, ["cpu"], False)


def _hooks(hook_class: Any, add_hook: Any) -> list[Any]:
    """Two offloaded layers tied to one weight: lent once while both run, freed after."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    second.weight = first.weight
    weights = {"weight": first.weight.detach().clone(), "bias": first.bias.detach().clone()}
    shared = weights["weight"]
    tied: dict[int, dict[Any, torch.Tensor]] = {shared.data_ptr(): {}}
    hooks = []
    for layer in (first, second):
        hook = hook_class(execution_device="cpu", offload=True, weights_map=weights)
        hook.tied_params_map = tied
        add_hook(layer, hook)
        hooks.append(hook)
    x = torch.ones(1, 3)
    hooks[0].pre_forward(first, x)
    hooks[1].pre_forward(second, x)
    during = (second.weight is first.weight, sorted(map(str, tied[shared.data_ptr()])))
    hooks[1].post_forward(second, x)
    hooks[0].post_forward(first, x)
    after = (first.weight.is_meta, second.weight.is_meta, dict(tied[shared.data_ptr()]))
    return [during, after]


def test_align_devices_hooks_lend_a_tied_weight_once() -> None:
    from accelerate.hooks import AlignDevicesHook as TheirHook
    from accelerate.hooks import add_hook_to_module as their_add

    from notebook_accel.hooks import AlignDevicesHook, add_hook_to_module

    theirs = _hooks(TheirHook, their_add)
    assert _hooks(AlignDevicesHook, add_hook_to_module) == theirs
    assert theirs == [(True, ["cpu"]), (True, True, {})]


def _broadcast(library: str, paths: list[str]) -> list[float]:
    import importlib

    from notebook_accel import PartialState

    state = PartialState()  # the job's process group
    load = importlib.import_module(library).load_checkpoint_in_model
    model = torch.nn.Linear(4, 2)
    torch.nn.init.zeros_(model.weight)
    load(model, paths[state.process_index], broadcast_from_rank0=True, strict=True)
    return model.weight.flatten().tolist()


def test_broadcast_from_rank0_reads_the_file_on_rank_0_only(tmp_path: Path) -> None:
    weights = {"weight": torch.arange(8.0).view(2, 4), "bias": torch.ones(2)}
    path = tmp_path / "model.safetensors"
    save_file(weights, str(path))
    # accelerate checks the path on every rank; ours reads nothing on rank 1: a path to
    # nothing there shows it
    theirs = debug_launcher(_broadcast, ("accelerate.utils", [str(path)] * 2), num_processes=2)
    missing = str(tmp_path / "nothing-here")
    ours = debug_launcher(_broadcast, ("notebook_accel.utils", [str(path), missing]), 2)
    assert ours == theirs == [list(range(8)), list(range(8))]
