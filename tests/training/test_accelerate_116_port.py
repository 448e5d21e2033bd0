"""accelerate 1.16's new names, parameters and Accelerator attributes give accelerate's answers.

One function body runs on 2 gloo processes with ``accelerate``'s imports (1.16) and then with
ours (only the import lines differ): the handler attributes, the fp8 facts, ``is_fsdp2``,
``multi_device``, ``save_iteration``, ``should_save_model``, ``verify_device_map``, the mesh
ranks' refusals without a mesh, ``gather/reduce/pad_across_processes(tensor=...)`` (``scale``
off XLA), the device helpers, the logging verbosity and ``str(distributed_type)`` must agree.
What accelerate refuses on CPU (a ParallelismConfig, FSDP) is checked against torch's mesh.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from notebook_accel import debug_launcher
from tests.training.test_accelerator_names_port import _run  # the body's main(argument)

BODY = textwrap.dedent(
    """
    import logging
    from datetime import timedelta

    import torch
    from accelerate import Accelerator
    from accelerate.logging import get_logger, get_verbosity, set_verbosity, set_verbosity_error
    from accelerate.utils import (
        AutocastKwargs,
        DistributedDataParallelKwargs,
        InitProcessGroupKwargs,
        get_distributed_backend,
        get_torch_accelerator_backend,
        normalize_device,
    )

    def attempt(function):
        try:
            return function()
        except Exception as error:
            return type(error).__name__

    def main(library):
        handlers = [
            DistributedDataParallelKwargs(find_unused_parameters=True),
            InitProcessGroupKwargs(timeout=timedelta(seconds=300)),
            AutocastKwargs(enabled=False),
        ]
        acc = Accelerator(cpu=True, kwargs_handlers=handlers)
        r = {
            "handlers": [
                None if h is None else h.to_kwargs()
                for h in (
                    acc.ddp_handler, acc.init_handler, acc.autocast_handler, acc.scaler_handler
                )
            ],
            "fp8": (
                acc.fp8_enabled,
                acc.has_fp8_handler,
                str(acc.fp8_backend.value),
                acc.delayed_fp8_autocast,
                acc.ao_recipe_handler,
                acc.te_recipe_handler,
            ),
            "kinds": (acc.is_fsdp2, acc.is_composable_parallelism_enabled, acc.multi_device),
            "saving": (acc.save_iteration, acc.should_save_model),
            "ranks": [
                attempt(lambda: acc.data_parallel_rank),
                attempt(lambda: acc.data_parallel_shard_rank),
                attempt(lambda: acc.tensor_parallel_rank),
                attempt(lambda: acc.context_parallel_rank),
                attempt(lambda: acc.pipeline_parallel_rank),
            ],
            "lomo": acc.has_lomo_optimizer,
            "str": (str(acc.distributed_type), repr(acc.state).splitlines()[0]),
        }
        model = torch.nn.Linear(2, 2)
        r["device_map"] = acc.verify_device_map(model)
        model.hf_device_map = {"a": 0, "b": "cpu"}
        r["device_map_split"] = acc.verify_device_map(model)
        loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
        r["ulysses"] = acc.deepspeed_ulysses_dl_adapter(loader, model) is loader

        rank = acc.process_index
        r["gather"] = acc.gather(tensor=torch.tensor([rank, 10 + rank])).tolist()
        reduced = acc.reduce(tensor=torch.tensor([1.0 + rank]), reduction="mean", scale=3.0)
        r["reduce"] = reduced.tolist()
        padded = acc.pad_across_processes(tensor=torch.ones(rank + 1), pad_index=-1, pad_first=True)
        r["pad"] = padded.tolist()

        r["devices"] = (
            get_torch_accelerator_backend(),
            [get_distributed_backend(kind) for kind in (None, "cpu", "mps", "cuda", "npu", "hpu")],
            [normalize_device(d) for d in ("cpu", 0, "npu", torch.device("cpu"))],
        )

        library_logger = logging.getLogger(library)
        before = library_logger.level
        child = logging.getLogger(library + ".part")
        pinned = get_logger(library + ".pinned", log_level="INFO")
        set_verbosity("warning")
        levels = [get_verbosity()]
        set_verbosity_error()
        levels += [get_verbosity(), child.getEffectiveLevel(), pinned.logger.level]
        levels.append(logging.getLogger().level)
        library_logger.setLevel(before)
        plain = get_logger(library + ".plain")
        levels.append(plain.logger.level)  # 1.16: no level forced without one asked for
        r["verbosity"] = levels
        acc.end_training()
        return r
    """
)


def _ours(source: str) -> str:
    for path in ("accelerate.utils", "accelerate.logging", "accelerate"):
        source = source.replace(
            f"from {path} import", f"from notebook_{path.replace('accelerate', 'accel', 1)} import"
        )
    assert "accelerate" not in source.replace("notebook_accel", "")
    return source


def test_116s_attributes_and_parameters_give_accelerates_answers() -> None:
    pytest.importorskip("accelerate")
    theirs = debug_launcher(_run, args=(BODY, "accelerate"), num_processes=2)
    ours = debug_launcher(_run, args=(_ours(BODY), "notebook_accel"), num_processes=2)
    assert ours == theirs
    first, second = theirs
    assert first["handlers"][0] == {"find_unused_parameters": True}
    assert first["fp8"] == (False, False, "NO", False, None, None)
    assert (first["saving"], second["saving"]) == ((0, True), (0, False))
    assert first["ranks"] == ["RuntimeError"] * 3 + ["NotImplementedError"] * 2
    assert first["str"][0] == "DistributedType.MULTI_CPU"
    assert (first["gather"], first["reduce"]) == ([0, 10, 1, 11], [1.5])  # scale: XLA only
    assert (first["pad"], second["pad"]) == ([-1.0, 1.0], [1.0, 1.0])
    levels = first["verbosity"]
    assert levels[:4] + levels[5:] == [
        logging.WARNING,
        logging.ERROR,
        logging.ERROR,
        logging.INFO,
        0,
    ]


def _mesh_ranks() -> list[Any]:
    from notebook_accel import Accelerator, ParallelismConfig

    out = []
    for config, dims in (
        (ParallelismConfig(tp_size=2), ("tp",)),
        (ParallelismConfig(dp_shard_size=2), ("dp_shard",)),
    ):
        acc = Accelerator(cpu=True, parallelism_config=config)
        mesh = acc.torch_device_mesh
        ranks = (acc.data_parallel_rank, acc.data_parallel_shard_rank, acc.tensor_parallel_rank)
        torch_says = [mesh.get_local_rank(dim) for dim in dims]
        out.append((ranks, torch_says, acc.is_fsdp2, acc.multi_device, acc.should_save_model))
    return out


def test_the_mesh_ranks_are_torchs_coordinates() -> None:
    """accelerate refuses a ParallelismConfig on CPU: ours against the mesh torch built."""
    first, second = debug_launcher(_mesh_ranks, num_processes=2)
    assert first == [((0, 0, 0), [0], False, False, True), ((0, 0, 0), [0], True, False, True)]
    assert second == [((0, 0, 1), [1], False, False, True), ((0, 1, 0), [1], True, False, True)]


def test_each_layout_coordinate_is_torchs() -> None:
    """init_device_mesh lays ranks out row-major over (dp_replicate, dp_shard, ..., tp)."""
    from notebook_accel import ParallelismConfig

    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=3, tp_size=2)
    layout = torch.arange(config.total_size).view(2, 3, 2)
    for rank in range(config.total_size):
        where = (layout == rank).nonzero()[0].tolist()
        names = ("dp_replicate", "dp_shard", "tp")
        assert [config.coordinate(name, rank) for name in names] == where


def test_prepare_places_each_object_as_its_device_placement_says(tmp_path: Path) -> None:
    from notebook_accel import Accelerator
    from notebook_accel.errors import ConfigError

    acc = Accelerator(cpu=True)
    with torch.device("meta"):
        kept = torch.nn.Linear(2, 2)
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    model, prepared = acc.prepare(kept, loader, device_placement=[False, True])
    assert next(model.parameters()).is_meta  # not moved: a meta tensor cannot be
    assert [b.tolist() for b in prepared] == [[0, 1], [2, 3]]
    with torch.device("meta"):
        moved = torch.nn.Linear(2, 2)
    with pytest.raises(NotImplementedError):  # moving a meta model is what placement does
        acc.prepare(moved, device_placement=[True])
    with pytest.raises(ConfigError, match="device_placement"):
        acc.prepare(torch.nn.Linear(1, 1), device_placement=[True, False])


def _lomo_package(folder: Path) -> None:
    """A stand-in ``lomo_optim`` (LOMO's package is not a dependency): its Lomo steps in
    ``fused_backward``, as the real one does."""
    (folder / "lomo_optim").mkdir()
    (folder / "lomo_optim" / "__init__.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Lomo(torch.optim.Optimizer):
                calls = []

                def __init__(self, params, lr=0.1):
                    super().__init__(params, {"lr": lr})

                def fused_backward(self, loss, lr):
                    loss.backward()
                    with torch.no_grad():
                        for group in self.param_groups:
                            for p in group["params"]:
                                p -= lr * p.grad
                                p.grad = None
                    Lomo.calls.append(lr)
            """
        )
    )


def test_lomo_optimizers_step_in_their_fused_backward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from notebook_accel import Accelerator
    from notebook_accel.errors import ConfigError

    _lomo_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import lomo_optim

    acc = Accelerator(cpu=True)
    assert acc.has_lomo_optimizer is False
    with pytest.raises(ConfigError, match="LOMO"):
        acc.lomo_backward(torch.tensor(1.0, requires_grad=True), 0.1)
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    model, optimizer = acc.prepare(model, lomo_optim.Lomo(model.parameters()))
    assert acc.has_lomo_optimizer is True
    acc.backward(model(torch.ones(1, 1)).sum(), learning_rate=0.5)
    assert lomo_optim.Lomo.calls == [0.5]
    assert model.weight.item() == pytest.approx(0.5)


def _precision_seen() -> tuple[str | None, bool, str, str]:
    import os

    import accelerate

    from notebook_accel import Accelerator

    theirs = accelerate.Accelerator(cpu=True).mixed_precision
    return (
        os.environ.get("ACCELERATE_MIXED_PRECISION"),
        "MIXED_PRECISION" in os.environ,
        theirs,
        Accelerator(cpu=True).mixed_precision,
    )


def test_the_launch_precision_reaches_accelerates_accelerator_in_the_workers() -> None:
    """accelerate 1.16's launcher passes ``mixed_precision`` as ACCELERATE_MIXED_PRECISION
    (1.15 dropped it on the way to multi-GPU workers): ours does too."""
    pytest.importorskip("accelerate")
    seen = debug_launcher(_precision_seen, num_processes=2, mixed_precision="bf16")
    assert seen == [("bf16", False, "bf16", "bf16")] * 2
