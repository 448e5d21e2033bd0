"""Every name of notebook_accel.big_modeling and .hooks (and the big-model names of
.utils) resolves, and accelerate 1.16 has each at the same path."""

from __future__ import annotations

import importlib

import pytest

BIG_UTILS = [
    "set_module_tensor_to_device", "compute_module_sizes", "convert_file_size_to_int",
    "dtype_byte_size", "find_tied_parameters", "named_module_tensors", "retie_parameters",
    "get_max_memory", "get_balanced_memory", "infer_auto_device_map", "get_max_layer_size",
    "load_checkpoint_in_model", "check_device_map", "offload_state_dict",
    "extract_submodules_state_dict",
]  # fmt: skip


@pytest.mark.parametrize("module", ["big_modeling", "hooks"])
def test_each_name_resolves_where_accelerate_has_it(module: str) -> None:
    ours = importlib.import_module(f"notebook_accel.{module}")
    theirs = importlib.import_module(f"accelerate.{module}")
    for name in ours.__all__:
        assert callable(getattr(ours, name)), name
        assert hasattr(theirs, name), f"accelerate.{module} has no {name}"


def test_the_big_model_names_of_utils() -> None:
    ours = importlib.import_module("notebook_accel.utils")
    theirs = importlib.import_module("accelerate.utils")
    for name in BIG_UTILS:
        assert callable(getattr(ours, name)), name
        assert hasattr(theirs, name), name
        assert name in dir(ours)
