"""accelerate's names the by_feature examples use: settable accumulation steps, schedule-free
optimizers through prepare, LocalSGD, get_logger, the is_*_available probes.

Distributed behaviour runs on 2 real processes (gloo); the references run in this process.
"""

from __future__ import annotations

import importlib.metadata
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from notebook_accel import debug_launcher
from notebook_accel.errors import ConfigError
from notebook_accel.training.accelerator import Accelerator


def _model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _batches(rank: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(4, 4, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]


# ---- gradient_accumulation_steps ------------------------------------------------------------
def test_gradient_accumulation_steps_is_settable_and_the_cycle_follows() -> None:
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(2, 1))
    opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    acc.gradient_accumulation_steps = 3  # as automatic_gradient_accumulation.py does
    assert acc.gradient_accumulation_steps == 3 == acc.gradient_state.accumulation_steps
    synced = []
    for _ in range(6):
        with acc.accumulate(model):
            acc.backward(model(torch.ones(1, 2)).sum())
            opt.step()
            opt.zero_grad()
            synced.append(acc.sync_gradients)
    assert synced == [False, False, True, False, False, True]
    for wrong in (0, None, 1.5, True):
        with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
            acc.gradient_accumulation_steps = wrong  # type: ignore[assignment]
    assert acc.gradient_accumulation_steps == 3


# ---- is_*_available ---------------------------------------------------------------------------
def _has(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_probes_answer_what_is_installed() -> None:
    from notebook_accel import utils

    assert utils.is_schedulefree_available() is _has("schedulefree")
    assert utils.is_deepspeed_available() is _has("deepspeed")
    assert utils.is_transformers_available() is _has("transformers")
    assert utils.is_xpu_available() is bool(torch.xpu.is_available())
    assert utils.is_xpu_available(check_device=True) is bool(torch.xpu.is_available())
    assert utils.is_npu_available() is (_has("torch_npu") and hasattr(torch, "npu"))
    assert utils.is_cuda_available() is (torch.cuda.device_count() > 0)
    assert "is_xpu_available" in dir(utils)


def test_a_stray_folder_named_like_a_package_is_not_the_package(tmp_path: Path) -> None:
    # A directory called torch_npu on sys.path is importable, but no torch_npu is installed.
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text("raise RuntimeError('not the real one')\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from notebook_accel.utils import is_npu_available\n"
        "print(is_npu_available(), is_npu_available(check_device=True))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


# ---- schedule-free optimizers -----------------------------------------------------------------
def _schedule_free(prepared: bool, steps: int = 5) -> dict[str, Any]:
    import schedulefree

    acc = Accelerator() if prepared else None
    model = _model()
    opt: Any = schedulefree.AdamWScheduleFree(model.parameters(), lr=0.05, warmup_steps=2)
    if acc is not None:
        model, opt = acc.prepare(model, opt)
    rank = acc.process_index if acc is not None else 0
    world = acc.num_processes if acc is not None else 1
    model.train()
    opt.train()
    for x, y in _batches(0, steps):  # each rank its own slice of one global batch
        x, y = x[rank::world], y[rank::world]
        loss = F.mse_loss(model(x), y)
        if acc is not None:
            acc.backward(loss)
        else:
            loss.backward()
        opt.step()
        opt.zero_grad()
    inner = acc.unwrap_model(model) if acc is not None else model
    training = [p.detach().clone() for p in inner.parameters()]
    model.eval()
    opt.eval()
    evaluated = [p.detach().clone() for p in inner.parameters()]
    opt.train()
    back = [p.detach().clone() for p in inner.parameters()]
    return {"train": training, "eval": evaluated, "back": back}


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True))


def test_schedule_free_train_and_eval_go_through_prepare() -> None:
    pytest.importorskip("schedulefree")
    ref = _schedule_free(prepared=False)
    one = _schedule_free(prepared=True)
    assert not _close(ref["train"], ref["eval"])  # eval() really swaps in the averaged weights
    for key in ("train", "eval", "back"):
        assert all(torch.equal(a, b) for a, b in zip(ref[key], one[key], strict=True)), key
    assert _close(one["back"], one["train"])
    # a plain optimizer's train()/eval() through prepare: no-ops, as accelerate's
    acc = Accelerator()
    plain = acc.prepare(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1))
    plain.train()
    plain.eval()


def _schedule_free_two() -> dict[str, Any]:
    return _schedule_free(prepared=True)


def test_schedule_free_on_two_processes_matches_one() -> None:
    pytest.importorskip("schedulefree")
    ranks = debug_launcher(_schedule_free_two, num_processes=2)
    ref = _schedule_free(prepared=False)  # 1 process, the whole batch (means: same gradient)
    for result in ranks:
        for key in ("train", "eval"):
            assert _close(result[key], ref[key]), key
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["eval"], ranks[1]["eval"], strict=True))


# ---- LocalSGD ---------------------------------------------------------------------------------
def _local_sgd(steps: int, enabled: bool = True) -> dict[str, Any]:
    from notebook_accel.local_sgd import LocalSGD

    acc = Accelerator()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    equal_after: list[bool] = []
    grads_equal: list[bool] = []
    with LocalSGD(accelerator=acc, model=model, local_sgd_steps=steps, enabled=enabled) as sgd:
        for x, y in _batches(acc.process_index, 5):  # each rank its own data
            with acc.accumulate(model):
                acc.backward(F.mse_loss(model(x), y))
                grad = acc.gather(next(model.parameters()).grad.detach()[None])
                grads_equal.append(bool(torch.equal(grad[0], grad[1])))
                opt.step()
                opt.zero_grad()
                sgd.step()
            flat = torch.cat([p.detach().flatten() for p in model.parameters()])
            both = acc.gather(flat[None])
            equal_after.append(bool(torch.equal(both[0], both[1])))
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    both = acc.gather(flat[None])
    return {"equal": equal_after, "grads": grads_equal, "end": bool(torch.equal(both[0], both[1]))}


def _local_sgd_runs() -> dict[str, Any]:
    return {"k2": _local_sgd(2), "off": _local_sgd(2, enabled=False)}


def test_local_sgd_averages_every_k_steps_on_two_processes() -> None:
    ranks = debug_launcher(_local_sgd_runs, num_processes=2)
    for result in ranks:
        k2 = result["k2"]
        assert k2["grads"] == [False] * 5  # no gradient all-reduce inside the block
        assert k2["equal"] == [False, True, False, True, False]  # averaged at steps 2 and 4
        assert k2["end"]  # and once more on leaving the block
        off = result["off"]  # disabled: plain DDP, gradients and weights always in step
        assert off["grads"] == [True] * 5 and off["equal"] == [True] * 5 and off["end"]


def test_local_sgd_checks_its_steps_and_does_nothing_in_one_process() -> None:
    from notebook_accel.local_sgd import LocalSGD

    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(2, 1))
    with LocalSGD(acc, model, local_sgd_steps=0) as sgd:  # one process: disabled, unchecked
        sgd.step()
    assert not sgd.enabled and sgd.num_steps == 1
    with pytest.raises(AttributeError):
        import notebook_accel.local_sgd as face

        face.NotAName  # noqa: B018


def _bad_local_sgd_steps() -> str:
    from notebook_accel.local_sgd import LocalSGD

    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(2, 1))
    try:
        LocalSGD(acc, model, local_sgd_steps=None)  # type: ignore[arg-type]
    except ConfigError as err:
        return err.parameter
    return "accepted"


def test_local_sgd_refuses_a_missing_step_count_when_enabled() -> None:
    assert debug_launcher(_bad_local_sgd_steps, num_processes=2) == ["local_sgd_steps"] * 2


# ---- get_logger -------------------------------------------------------------------------------
def _log_to(path: str) -> None:
    from notebook_accel.logging import get_logger

    logger = get_logger("names.test", log_level="INFO")
    handler = logging.FileHandler(path)  # every rank appends to the same file
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.logger.addHandler(handler)
    logger.logger.propagate = False
    acc = Accelerator()
    logger.info("main only")
    acc.wait_for_everyone()  # rank 1 logs nothing above: without this it could write first
    logger.info("every rank", main_process_only=False)
    acc.wait_for_everyone()
    for _ in range(3):
        logger.info("in order", in_order=True)
    logger.debug("below the level", main_process_only=False)
    handler.close()


def test_get_logger_logs_on_main_every_rank_or_in_order(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    debug_launcher(_log_to, (str(path),), num_processes=2)
    lines = path.read_text().splitlines()
    assert lines[0] == "[RANK 0] main only"
    assert sorted(lines[1:3]) == ["[RANK 0] every rank", "[RANK 1] every rank"]
    assert lines[3:] == ["[RANK 0] in order", "[RANK 1] in order"] * 3


def test_get_logger_takes_accelerate_log_level(monkeypatch: pytest.MonkeyPatch) -> None:
    from notebook_accel.logging import MultiProcessAdapter, get_logger

    root = logging.getLogger().level
    try:
        monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "debug")
        logger = get_logger("names.level")
        assert isinstance(logger, MultiProcessAdapter)
        assert logger.logger.level == logging.DEBUG
    finally:
        logging.getLogger().setLevel(root)


# ---- profile() / ProfileKwargs ----------------------------------------------------------------
def _profiled(folder: str) -> dict[str, Any]:
    from notebook_accel.utils import ProfileKwargs

    ready: list[int] = []
    handler = ProfileKwargs(
        activities=["cpu"],
        record_shapes=True,
        with_flops=True,
        schedule_option={"wait": 1, "warmup": 1, "active": 2, "repeat": 1},
        on_trace_ready=lambda prof: ready.append(len(prof.events())),
        output_trace_dir=folder,
    )
    acc = Accelerator(kwargs_handlers=[handler])
    model = acc.prepare(_model())
    with acc.profile() as prof:
        for x, _ in _batches(acc.process_index, 6):
            model(x).sum().backward()
            prof.step()
    shapes = any(e.input_shapes for e in prof.events())
    with acc.profile(ProfileKwargs()) as plain:  # an explicit handler wins: no trace file
        torch.ones(8, 8) @ torch.ones(8, 8)
    names = {e.key for e in plain.key_averages()}
    return {"ready": ready, "shapes": shapes, "names": names, "rank": acc.process_index}


def test_profile_writes_a_trace_per_rank(tmp_path: Path) -> None:
    import json

    folder = tmp_path / "traces"
    ranks = debug_launcher(_profiled, (str(folder),), num_processes=2)
    assert sorted(p.name for p in folder.iterdir()) == ["profile_0.json", "profile_1.json"]
    for result in ranks:
        assert len(result["ready"]) == 1 and result["ready"][0] > 0  # one active cycle
        assert result["shapes"] and "aten::mm" in result["names"]
    for rank in (0, 1):
        trace = json.loads((folder / f"profile_{rank}.json").read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert "aten::addmm" in names or "aten::linear" in names


def test_profile_kwargs_refuse_unknown_options() -> None:
    from notebook_accel import ProfileKwargs

    with pytest.raises(ConfigError, match="activities"):
        ProfileKwargs(activities=["gpu"])
    with pytest.raises(ConfigError, match="schedule_option"):
        ProfileKwargs(schedule_option={"wait": 1, "cooldown": 2})
    if not torch.xpu.is_available():
        with pytest.raises(ConfigError, match="this machine has"):
            ProfileKwargs(activities=["xpu"]).build()
    acc = Accelerator()
    assert acc.profile_handler is None
    with acc.profile() as prof:  # torch's defaults
        torch.ones(2) + 1
    assert any(e.name == "aten::add" for e in prof.events())


def test_the_ported_import_paths_stay_light() -> None:
    code = (
        "import sys\n"
        "import notebook_accel.logging, notebook_accel.local_sgd\n"
        "from notebook_accel.utils import is_schedulefree_available, is_deepspeed_available\n"
        "is_schedulefree_available(), is_deepspeed_available()\n"
        "print(sorted(m for m in ('torch', 'schedulefree', 'deepspeed') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
