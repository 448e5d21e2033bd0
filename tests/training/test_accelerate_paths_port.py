"""The census's names at accelerate's module paths give accelerate's answers: one body, two
imports.

The same function body runs on 2 gloo processes with ``accelerate``'s imports (1.16) and then
with ours (only the import lines differ): ``accelerate.state``'s ``AcceleratorState`` after an
``Accelerator`` and ``is_initialized()`` before and after, ``accelerate.utils``' collectives
with their signatures and defaults, ``send_to_device``, ``synchronize_rng_states`` (a
generator too), ``patch_environment``, the enums, ``extract_model_from_parallel``,
``AutocastKwargs``, ``GradientAccumulationPlugin``, ``native_amp``, ``torch_device_mesh``,
``maybe_context_parallel``, the probes, ``utils.memory`` and ``tracking``'s trackers.
"""

from __future__ import annotations

import logging
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

from notebook_accel import debug_launcher

BODY = textwrap.dedent(
    """
    import os

    import torch
    import accelerate.state
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.tracking import GeneralTracker, WandBTracker
    from accelerate.utils import (
        AutocastKwargs,
        GradientAccumulationPlugin,
        LoggerType,
        PrecisionType,
        RNGType,
        broadcast,
        broadcast_object_list,
        extract_model_from_parallel,
        gather,
        gather_object,
        is_bf16_available,
        is_rich_available,
        is_torch_xla_available,
        pad_across_processes,
        patch_environment,
        reduce,
        send_to_device,
        synchronize_rng_state,
        synchronize_rng_states,
        wait_for_everyone,
    )
    from accelerate.utils.memory import clear_device_cache

    def main():
        r = {"before": accelerate.state.is_initialized()}
        acc = Accelerator(
            cpu=True,
            mixed_precision="bf16",
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        )
        r["after"] = accelerate.state.is_initialized()
        s = AcceleratorState()
        r["state"] = (
            s.mixed_precision,
            s.distributed_type.value,
            s.num_processes,
            s.process_index,
            s.device.type,
            s.is_main_process,
            s.deepspeed_plugin,
        )
        r["partial"] = (PartialState().process_index, PartialState().num_processes)
        r["flags"] = (acc.native_amp, acc.torch_device_mesh, acc.gradient_accumulation_steps)
        r["accelerator.state"] = (acc.state.mixed_precision, acc.state.deepspeed_plugin)
        rank = acc.process_index

        t = torch.tensor([float(rank + 1), 2.0])
        r["gather"] = gather(t).tolist()
        r["reduce"] = (reduce(t).tolist(), reduce(t, "sum").tolist(), reduce(t, "max").tolist())
        r["reduce_scaled"] = (reduce(t, "sum", 2.0).tolist(), reduce(t, "none").tolist())
        r["untouched"] = t.tolist()
        r["broadcast"] = broadcast({"a": t}, from_process=1)["a"].tolist()
        r["objects"] = broadcast_object_list([rank, f"r{rank}"], from_process=1)
        r["gathered"] = (gather_object([rank, "a"]), gather_object({"k": rank}))
        r["pad"] = pad_across_processes(torch.ones(rank + 1), pad_index=-1).tolist()
        wide = torch.ones(2, rank + 1)
        r["pad_first"] = pad_across_processes(wide, dim=1, pad_first=True).tolist()
        batch = {"x": t, "n": 3, "skip": t, "l": [t, (t, "s")]}
        moved = send_to_device(batch, "cpu", skip_keys="skip")
        r["moved"] = (sorted(moved), moved["skip"] is t, type(moved["l"][1]).__name__, moved["n"])
        wait_for_everyone()

        torch.manual_seed(rank)
        g = torch.Generator().manual_seed(10 + rank)
        synchronize_rng_states(["torch", "generator"], generator=g)
        r["rng"] = (torch.rand(2).tolist(), torch.rand(2, generator=g).tolist())
        torch.manual_seed(100 + rank)
        synchronize_rng_state(RNGType.TORCH)
        r["rng_one"] = torch.rand(2).tolist()

        with patch_environment(port_test_var=5, OTHER_port_VAR="x"):
            r["env_in"] = (os.environ.get("PORT_TEST_VAR"), os.environ.get("OTHER_PORT_VAR"))
        r["env_out"] = (os.environ.get("PORT_TEST_VAR"), os.environ.get("OTHER_PORT_VAR"))

        r["enums"] = (
            str(LoggerType.WANDB),
            LoggerType("tensorboard").name,
            PrecisionType.BF16.value,
            PrecisionType("fp16").name,
        )

        model = torch.nn.Linear(2, 1)
        prepared = acc.prepare(model)
        r["unwrap"] = (
            type(prepared).__name__,
            extract_model_from_parallel(prepared) is model,
            extract_model_from_parallel(model) is model,
        )
        x = torch.ones(2, 2)
        with acc.autocast():
            r["autocast"] = str((x @ x).dtype)
        with acc.autocast(autocast_handler=AutocastKwargs(enabled=False)):
            r["autocast_off"] = str((x @ x).dtype)
        with acc.maybe_context_parallel(buffers=[x], buffer_seq_dims=[1]):
            r["context_parallel"] = str((x + 1).sum().item())

        r["probes"] = (is_bf16_available(), is_torch_xla_available(), is_rich_available())
        clear_device_cache(garbage_collection=True)
        r["trackers"] = issubclass(WandBTracker, GeneralTracker)

        # GradientState() reads the Accelerator's: in and out of an accumulation cycle
        seen = []
        opt = torch.optim.SGD(prepared.parameters(), lr=0.1)
        opt = acc.prepare(opt)
        for _ in range(3):
            with acc.accumulate(prepared):
                acc.backward(prepared(torch.ones(1, 2)).sum())
                gs = GradientState()
                seen.append((gs.sync_gradients, gs.num_steps, gs.end_of_dataloader, gs.remainder))
                opt.step()
                opt.zero_grad()
        r["gradient_state"] = seen
        gs = GradientState()
        r["gradient_flags"] = (gs.adjust_scheduler, gs.sync_with_dataloader, gs.initialized)

        # AutocastKwargs in kwargs_handlers: a prepared model's forward follows it
        class Probe(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(2, 2)

            def forward(self, x):
                y = self.lin(x)
                return y, str(y.dtype)

        inner = {}
        for enabled in (True, False):
            handlers = [AutocastKwargs(enabled=enabled)]
            other = Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=handlers)
            out, seen = other.prepare(Probe())(torch.ones(1, 2))
            inner[enabled] = (seen, str(out.dtype))
        r["autocast_handler"] = inner
        acc.end_training()
        return r
    """
)


def _run(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<ported>", "exec"), namespace)
    return namespace["main"]()  # type: ignore[no-any-return]


def _ours(source: str) -> str:
    ours = source.replace("import accelerate.state", "import notebook_accel.state")
    ours = ours.replace("accelerate.state.is_initialized", "notebook_accel.state.is_initialized")
    ours = ours.replace("from accelerate", "from notebook_accel")
    assert "accelerate" not in ours.replace("notebook_accel", "")
    return ours


def test_the_census_names_give_accelerates_answers() -> None:
    pytest.importorskip("accelerate")
    theirs = debug_launcher(_run, args=(BODY,), num_processes=2)
    ours = debug_launcher(_run, args=(_ours(BODY),), num_processes=2)
    assert ours == theirs
    first = theirs[0]
    assert (first["before"], first["after"]) == (False, True)
    assert first["state"][:4] == ("bf16", "MULTI_CPU", 2, 0)
    assert first["flags"] == (True, None, 2)
    assert first["reduce"] == ([1.5, 2.0], [3.0, 4.0], [2.0, 2.0])
    assert first["objects"] == [1, "r1"]
    assert first["gathered"] == ([0, "a", 1, "a"], ["k", "k"])
    assert first["autocast"] == "torch.bfloat16" and first["autocast_off"] == "torch.float32"
    assert first["autocast_handler"] == {
        True: ("torch.bfloat16", "torch.float32"),
        False: ("torch.float32", "torch.float32"),
    }
    assert first["env_in"] == ("5", "x") and first["env_out"] == (None, None)
    assert theirs[0]["rng"] == theirs[1]["rng"]
    assert theirs[0]["rng_one"] == theirs[1]["rng_one"]
    assert first["gradient_state"] == [(False, 2, False, -1), (True, 2, False, -1)] + [
        (False, 2, False, -1)
    ]


ALONE = textwrap.dedent(
    """
    import accelerate.state
    from accelerate.state import AcceleratorState, GradientState

    def main():
        before = accelerate.state.is_initialized()
        try:
            AcceleratorState(mixed_precision="bf16", cpu=True)
            refused = None
        except ValueError as error:
            refused = "initialize your accelerator via `accelerator = Accelerator()`" in str(error)
        g = GradientState()
        return (before, refused, (g.sync_gradients, g.num_steps, g.end_of_dataloader, g.remainder))
    """
)


def test_an_accelerator_state_without_an_accelerator_is_refused() -> None:
    """AcceleratorState() before any Accelerator: accelerate's ValueError; GradientState()
    is a fresh one."""
    pytest.importorskip("accelerate")
    theirs = debug_launcher(_run, args=(ALONE,), num_processes=2)
    ours = debug_launcher(_run, args=(_ours(ALONE),), num_processes=2)
    assert ours == theirs
    assert theirs[1] == (False, True, (True, 1, False, -1))


def _meshes() -> list[Any]:
    from notebook_accel import Accelerator, ParallelismConfig
    from notebook_accel.state import AcceleratorState

    out = []
    for config in (ParallelismConfig(tp_size=2), ParallelismConfig(dp_shard_size=2)):
        acc = Accelerator(cpu=True, parallelism_config=config)
        mesh = acc.torch_device_mesh
        kinds = (acc.distributed_type.value, AcceleratorState().distributed_type.value)
        out.append((type(mesh).__name__, mesh.mesh_dim_names, tuple(mesh.shape), kinds))
    out.append(Accelerator(cpu=True, fsdp="full").distributed_type.value)
    return out


def test_torch_device_mesh_and_distributed_type_follow_the_strategy() -> None:
    meshes = debug_launcher(_meshes, num_processes=2)
    assert meshes[0] == meshes[1]
    tp, fsdp, plain_fsdp = meshes[0]
    assert tp == ("DeviceMesh", ("dp_shard", "tp"), (1, 2), ("MULTI_CPU", "MULTI_CPU"))
    assert fsdp == ("DeviceMesh", ("dp_shard",), (2,), ("FSDP", "FSDP"))
    assert plain_fsdp == "FSDP"


def test_a_plugin_other_than_accelerates_defaults_is_refused() -> None:
    from notebook_accel import Accelerator, ConfigError
    from notebook_accel.utils import GradientAccumulationPlugin

    with pytest.raises(ConfigError, match="sync_each_batch"):
        Accelerator(
            cpu=True,
            gradient_accumulation_plugin=GradientAccumulationPlugin(2, sync_each_batch=True),
        )
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        Accelerator(
            cpu=True,
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        )


def test_the_attributes_accelerate_dropped_or_never_had(caplog: pytest.LogCaptureFixture) -> None:
    from notebook_accel import Accelerator

    acc = Accelerator(cpu=True)
    with pytest.warns(FutureWarning, match="use_fp16"):
        assert acc.use_fp16 is False
    assert acc.fsdp_plugin is None and acc.torch_device_mesh is None
    assert acc.native_amp is False
    with caplog.at_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            with acc.maybe_context_parallel():
                pass
    said = [r.message for r in caplog.records if "Context parallel" in r.message]
    assert said == [
        "[RANK 0] Context parallel training is not enabled. This context manager will have no "
        "effect (notebook_accel has no context parallelism)."
    ]


def test_the_environment_helpers_answer_as_accelerates(monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = pytest.importorskip("accelerate.utils")
    import notebook_accel.utils as ours

    for word in ("YES", "t", "On", "1", "n", "False", "off", "0"):
        for to_bool in (False, True):
            assert ours.str_to_bool(word, to_bool) == theirs.str_to_bool(word, to_bool)
            assert type(ours.str_to_bool(word, to_bool)) is type(theirs.str_to_bool(word, to_bool))
    with pytest.raises(ValueError, match="invalid truth value maybe"):
        ours.str_to_bool("maybe")
    monkeypatch.setenv("PORT_FLAG", "yes")
    monkeypatch.setenv("PORT_INT_B", "7")
    monkeypatch.delenv("PORT_UNSET", raising=False)
    for name in ("parse_flag_from_env", "parse_choice_from_env"):
        for key in ("PORT_FLAG", "PORT_UNSET"):
            assert getattr(ours, name)(key) == getattr(theirs, name)(key), (name, key)
    for keys in (["PORT_UNSET", "PORT_INT_B"], ["PORT_UNSET"]):
        assert ours.get_int_from_env(keys, 3) == theirs.get_int_from_env(keys, 3)


def _after_the_accelerator_is_gone() -> tuple[Any, ...]:
    import gc

    from notebook_accel import Accelerator
    from notebook_accel.state import AcceleratorState, is_initialized

    def build() -> None:
        Accelerator(cpu=True, mixed_precision="bf16")

    build()
    gc.collect()
    state = AcceleratorState()
    return is_initialized(), state.mixed_precision, state.num_processes, state.device_mesh


def test_the_facts_outlive_the_accelerator() -> None:
    """As accelerate's shared state does: the Accelerator built in a helper and dropped."""
    assert (
        debug_launcher(_after_the_accelerator_is_gone, num_processes=2)
        == [(True, "bf16", 2, None)] * 2
    )


def test_logger_type_members_name_trackers(tmp_path: Path) -> None:
    from notebook_accel import Accelerator, ConfigError
    from notebook_accel.tracking import LoggerType
    from notebook_accel.utils import is_tensorboard_available

    if is_tensorboard_available():
        acc = Accelerator(cpu=True, log_with=[LoggerType.TENSORBOARD], project_dir=tmp_path)
        assert acc.log_with == ["tensorboard"]
    with pytest.raises(ConfigError, match="comet_ml"):  # accelerate's, not built in here
        Accelerator(cpu=True, log_with=LoggerType.COMETML)


SEED_AND_BARS = textwrap.dedent(
    """
    import torch
    from accelerate.utils import set_seed, tqdm

    def main():
        set_seed(3, deterministic=True)
        deterministic = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(False)
        every_rank = sum(tqdm(range(4), main_process_only=False))
        main_only = sum(tqdm(range(4), desc="main"))
        return deterministic, every_rank, main_only, torch.rand(2).tolist()
    """
)


def test_set_seed_deterministic_and_tqdm_main_process_only() -> None:
    pytest.importorskip("accelerate")
    theirs = debug_launcher(_run, args=(SEED_AND_BARS,), num_processes=2)
    ours = debug_launcher(_run, args=(_ours(SEED_AND_BARS),), num_processes=2)
    assert ours == theirs
    assert theirs[0][:3] == (True, 6, 6)


CUSTOM_TRACKER = textwrap.dedent(
    """
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker

    class Recorder(GeneralTracker):
        name = "recorder"
        requires_logging_directory = False

        def __init__(self):
            super().__init__()
            self.events = []

        @property
        def tracker(self):
            return self.events

        def start(self):
            self.events.append("start")

        def store_init_configuration(self, values):
            self.events.append(("config", values))

        def log(self, values, step=None, **kwargs):
            self.events.append(("log", values, step))

    def main():
        recorder = Recorder()
        acc = Accelerator(cpu=True, log_with=[recorder])
        acc.init_trackers("project", config={"lr": 0.5})
        acc.log({"loss": 1.5}, step=2)
        return recorder.events, acc.get_tracker("recorder", unwrap=True) is recorder.events
    """
)


def test_a_tracker_of_ones_own_is_started_as_accelerates() -> None:
    """accelerate's init_trackers calls start() on every tracker, then stores the config."""
    pytest.importorskip("accelerate")
    theirs = debug_launcher(_run, args=(CUSTOM_TRACKER,), num_processes=1)
    ours = debug_launcher(_run, args=(_ours(CUSTOM_TRACKER),), num_processes=1)
    assert ours == theirs
    assert theirs[0] == (["start", ("config", {"lr": 0.5}), ("log", {"loss": 1.5}, 2)], True)
