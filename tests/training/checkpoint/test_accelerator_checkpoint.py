"""save_state / load_state: resume equivalence across launches, atomicity, clear errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import debug_launcher
from notebook_accel.errors import CheckpointError, WorkerDiedError


def make_dataset(n: int = 24) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x @ torch.randn(6, 2, generator=g), torch.arange(n))


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2)
    )


def prepared(**kwargs: Any) -> tuple[Any, ...]:
    from notebook_accel.seeding import set_seed
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(**kwargs)
    # Per-rank seeds, so the test can see each rank's RNG restored from its own file;
    # DDP still starts every rank from rank 0's weights.
    set_seed(0, device_specific=True)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    loader = DataLoader(make_dataset(), batch_size=4, shuffle=True)
    return (acc, *acc.prepare(model, opt, loader, sched))


def _run(folder: str, resume: bool, save_at: int = 5) -> dict:
    """10 steps, saving after step ``save_at``; or load that checkpoint and do the rest."""
    acc, model, opt, loader, sched = prepared()
    if resume:
        assert len(loader) == 3  # len() before load_state must not pin a stale order
        acc.load_state(folder)
    step, seen, noise = acc.step, [], []
    while step < 10:
        for x, y, idx in loader:
            acc.backward(F.mse_loss(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
            step += 1
            seen.append(acc.gather(idx).tolist())
            noise.append(torch.rand(1).item())
            if step == save_at and not resume:
                acc.save_state(folder)
            if step == 10:
                break
    weights = [p.detach().clone() for p in acc.unwrap_model(model).parameters()]
    return {"weights": weights, "seen": seen, "noise": noise, "lr": sched.get_last_lr()}


# 3 steps per epoch on 2 ranks: step 5 is in the middle of epoch 2, step 3 ends epoch 1 (the
# shuffle's generator, seeded at prepare, must go on from where epoch 1 left it).
@pytest.mark.parametrize("save_at", [5, 3])
def test_resume_equals_uninterrupted_run(tmp_path: Path, save_at: int) -> None:
    folder = str(tmp_path / "ckpt")
    full = debug_launcher(_run, args=(folder, False, save_at), num_processes=2)
    resumed = debug_launcher(_run, args=(folder, True, save_at), num_processes=2)
    for whole, second in zip(full, resumed, strict=True):
        assert second["seen"] == whole["seen"][save_at:]  # same data order, mid-epoch included
        assert second["noise"] == whole["noise"][save_at:]  # every rank's RNG continued
        assert second["lr"] == whole["lr"]
        for a, b in zip(whole["weights"], second["weights"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert full[0]["noise"] != full[1]["noise"]  # ranks' RNG streams are their own


def _crash_while_saving(folder: str, expected: str) -> None:
    acc, model, opt, loader, sched = prepared()
    for x, y, _ in loader:
        acc.backward(F.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    acc.save_state(folder)
    torch.save(acc.get_state_dict(model), expected)
    for x, y, _ in loader:
        acc.backward(F.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    real_save = torch.save

    def save_then_die(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        real_save(obj, f, *args, **kwargs)
        if "optimizer.bin" in str(f):
            os._exit(3)  # a crash half-way through the checkpoint

    torch.save = save_then_die  # type: ignore[assignment]
    acc.save_state(folder)


def test_crash_during_save_keeps_last_checkpoint(tmp_path: Path) -> None:
    folder, expected = tmp_path / "ckpt", tmp_path / "expected.pt"
    with pytest.raises(WorkerDiedError):
        debug_launcher(_crash_while_saving, args=(str(folder), str(expected)), num_processes=2)
    assert (tmp_path / ".ckpt.saving").is_dir()  # the half-written one never replaced it
    acc, model, *_ = prepared()
    acc.load_state(folder)
    weights = torch.load(expected, weights_only=True)
    for name, value in acc.get_state_dict(model).items():
        torch.testing.assert_close(value, weights[name], rtol=0, atol=0)
    acc.save_state(folder)  # a later save clears the leftover and succeeds
    assert not (tmp_path / ".ckpt.saving").exists()


class Exploding:
    def state_dict(self) -> dict:
        raise RuntimeError("disk full")

    def load_state_dict(self, state: dict) -> None:
        pass


def test_exception_during_save_keeps_last_checkpoint(tmp_path: Path) -> None:
    acc, model, *_ = prepared()
    acc.save_state(tmp_path / "ckpt")
    before = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    acc.register_for_checkpointing(Exploding())
    with pytest.raises(RuntimeError, match="disk full"):
        acc.save_state(tmp_path / "ckpt")
    acc2, model2, *_ = prepared()
    acc2.load_state(tmp_path / "ckpt")
    for name, value in acc2.get_state_dict(model2).items():
        assert torch.equal(value, before[name])


def test_checkpoint_files_load_with_weights_only(tmp_path: Path) -> None:
    acc, model, opt, loader, sched = prepared(mixed_precision="fp16")
    for x, y, _ in loader:
        acc.backward(F.mse_loss(model(x), y))
        opt.step()
        sched.step()
        opt.zero_grad()
    acc.save_state(tmp_path / "ckpt")
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == [  # accelerate's names, plus our loader position and counts
        "dataloader.bin",
        "model.safetensors",
        "notebook_accel.json",
        "optimizer.bin",
        "random_states_0.pkl",
        "scaler.pt",
        "scheduler.bin",
    ]
    for name in ["dataloader.bin", "optimizer.bin", "scaler.pt", "scheduler.bin"]:
        torch.load(tmp_path / "ckpt" / name, weights_only=True)
    # numpy's RNG state is an array: loadable with weights_only once numpy's globals are allowed
    from notebook_accel.training.checkpoint.files import load_rng_file

    rng = load_rng_file(tmp_path / "ckpt" / "random_states_0.pkl")
    assert rng["step"] == acc.step and rng["numpy_random_seed"][0] == "MT19937"
    scaler = torch.load(tmp_path / "ckpt" / "scaler.pt", weights_only=True)
    assert scaler["scale"] == acc.scaler.state_dict()["scale"]
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "ckpt" / "model.safetensors")
    for name, value in acc.get_state_dict(model).items():
        assert torch.equal(weights[name], value)


def test_missing_or_mismatched_checkpoint_names_the_file(tmp_path: Path) -> None:
    acc, model, *_ = prepared()
    with pytest.raises(CheckpointError, match="no such checkpoint folder") as missing:
        acc.load_state(tmp_path / "nowhere")
    assert missing.value.path.endswith("nowhere")
    acc.save_state(tmp_path / "ckpt")

    other, *_ = prepared()
    other.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match=r"holds 1 model\(s\) but 2") as count:
        other.load_state(tmp_path / "ckpt")
    assert count.value.path.endswith("notebook_accel.json")

    from notebook_accel.training.accelerator import Accelerator

    wrong = Accelerator()
    wrong.prepare(torch.nn.Linear(6, 3))
    (tmp_path / "small").mkdir()
    wrong.save_state(tmp_path / "small" / "ckpt")
    with pytest.raises(CheckpointError, match="size mismatch") as shape:
        wrong_shape = Accelerator()
        wrong_shape.prepare(torch.nn.Linear(6, 4))
        wrong_shape.load_state(tmp_path / "small" / "ckpt")
    assert shape.value.path.endswith("model.safetensors")

    # A rank without its random states (saved by the main process only, or by fewer
    # processes) loads the rest and says what it could not restore.
    (tmp_path / "ckpt" / "random_states_0.pkl").unlink()
    with pytest.warns(
        UserWarning, match="random_states_0.pkl is not in .*; rank 0 keeps its current"
    ):
        acc.load_state(tmp_path / "ckpt")


def test_crash_between_the_two_renames_is_recovered(tmp_path: Path) -> None:
    acc, model, opt, loader, sched = prepared()
    for x, y, _ in loader:
        acc.backward(F.mse_loss(model(x), y))
        opt.step()
        sched.step()
        opt.zero_grad()
    acc.save_state(tmp_path / "ckpt")
    saved = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    (tmp_path / "ckpt").rename(tmp_path / ".ckpt.old")  # as if killed right after rename 1

    other, model2, opt2, _, sched2 = prepared()
    other.load_state(tmp_path / "ckpt")
    for name, value in other.get_state_dict(model2).items():
        assert torch.equal(value, saved[name])
    assert other.step == acc.step == 6
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def _save_on_two(folder: str) -> list[float]:
    acc, model, *_ = prepared()
    acc.save_state(folder)
    return [float(p.sum()) for p in acc.unwrap_model(model).parameters()]


def _load_on_three(folder: str) -> tuple[list[float], list[str]]:
    import warnings

    acc, model, *_ = prepared()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        acc.load_state(folder)
    return [float(p.sum()) for p in acc.unwrap_model(model).parameters()], [
        str(w.message) for w in caught
    ]


def test_a_checkpoint_resumes_on_more_processes(tmp_path: Path) -> None:
    from notebook_accel import debug_launcher

    folder = str(tmp_path / "ckpt")
    saved = debug_launcher(_save_on_two, args=(folder,), num_processes=2)[0]
    loaded = debug_launcher(_load_on_three, args=(folder,), num_processes=3)
    assert all(weights == pytest.approx(saved) for weights, _ in loaded)
    assert loaded[0][1] == [] and loaded[1][1] == []  # ranks 0 and 1 had their own files
    assert "saved by 2 processes and this job has 3" in loaded[2][1][0]


def _train(acc: Any, model: Any, opt: Any, loader: Any, steps: int) -> None:
    for i, (x, y, _) in enumerate(loader):
        if i == steps:
            break
        acc.backward(F.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()


def _save_on_main_only(folder: str) -> dict[str, Any]:
    acc, model, opt, loader, sched = prepared()
    _train(acc, model, opt, loader, 2)
    if acc.is_main_process:  # the pattern of many accelerate scripts
        acc.save_state(folder)
    saved = [p.detach().clone() for p in acc.unwrap_model(model).parameters()]
    # The launch goes on: collectives still pair up, and an all-ranks save still works.
    total = acc.reduce(torch.tensor([float(acc.process_index + 1)]), "sum")
    acc.wait_for_everyone()
    acc.save_state(folder + "_all")
    _train(acc, model, opt, loader, 1)
    return {"saved": saved, "total": total.item(), "step": acc.step}


def _load_main_only(folder: str) -> dict[str, Any]:
    import warnings

    acc, model, opt, loader, sched = prepared()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        acc.load_state(folder)
    weights = [p.detach().clone() for p in acc.unwrap_model(model).parameters()]
    return {"weights": weights, "step": acc.step, "warnings": [str(w.message) for w in caught]}


def test_save_state_on_the_main_process_only(tmp_path: Path) -> None:
    folder = str(tmp_path / "ckpt")
    saved = debug_launcher(_save_on_main_only, args=(folder,), num_processes=2)
    assert [r["total"] for r in saved] == [3.0, 3.0]
    assert sorted(p.name for p in Path(folder).glob("random_states_*")) == ["random_states_0.pkl"]
    assert sorted(p.name for p in Path(folder + "_all").glob("random_states_*")) == [
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]
    loaded = debug_launcher(_load_main_only, args=(folder,), num_processes=2)
    for rank in range(2):
        assert loaded[rank]["step"] == 2
        for a, b in zip(loaded[rank]["weights"], saved[0]["saved"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert loaded[0]["warnings"] == []
    assert "random_states_1.pkl is not in" in loaded[1]["warnings"][0]
    assert "by the main process only" in loaded[1]["warnings"][0]


def _own_folder(root: str, rank: int) -> str:
    return str(Path(root) / f"machine{rank}" / "run" / "ckpt")  # no parent exists yet


def _save_per_rank_folder(root: str, each_node: bool) -> dict[str, Any]:
    import os

    from notebook_accel import ProjectConfiguration

    if each_node:
        # Pretend each rank is alone on its machine, as two machines with local disks are.
        os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"] = "0", "1"
    config = ProjectConfiguration(save_on_each_node=each_node)
    acc, model, opt, loader, sched = prepared(project_config=config)
    _train(acc, model, opt, loader, 2)
    acc.save_state(_own_folder(root, acc.process_index))
    after = [torch.rand(1).item() for _ in range(3)]
    weights = [p.detach().clone() for p in acc.unwrap_model(model).parameters()]
    return {"after": after, "weights": weights}


def _load_per_rank_folder(root: str) -> dict[str, Any]:
    acc, model, opt, loader, sched = prepared()
    acc.load_state(_own_folder(root, acc.process_index))
    after = [torch.rand(1).item() for _ in range(3)]
    weights = [p.detach().clone() for p in acc.unwrap_model(model).parameters()]
    return {"after": after, "weights": weights, "step": acc.step}


@pytest.mark.parametrize("each_node", [False, True], ids=["main-writes", "save_on_each_node"])
def test_save_state_with_a_folder_per_machine(tmp_path: Path, each_node: bool) -> None:
    saved = debug_launcher(_save_per_rank_folder, args=(str(tmp_path), each_node))
    full = {
        "model.safetensors",
        "optimizer.bin",
        "scheduler.bin",
        "dataloader.bin",
        "notebook_accel.json",
        "random_states_0.pkl",
    }
    assert {p.name for p in Path(_own_folder(str(tmp_path), 0)).iterdir()} == full
    second = {p.name for p in Path(_own_folder(str(tmp_path), 1)).iterdir()}
    if each_node:  # every machine wrote a full copy
        assert second == full - {"random_states_0.pkl"} | {"random_states_1.pkl"}
    else:  # machine 1 wrote what it holds; loading gets the rest from machine 0
        assert second == {"random_states_1.pkl"}
    loaded = debug_launcher(_load_per_rank_folder, args=(str(tmp_path),))
    for rank in range(2):
        assert loaded[rank]["step"] == 2
        assert loaded[rank]["after"] == saved[rank]["after"]  # each rank's own RNG stream
        for a, b in zip(loaded[rank]["weights"], saved[rank]["weights"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def _writer_fails(folder: str) -> str:
    acc, model, opt, loader, sched = prepared()
    acc.save_state(folder)
    acc.register_for_checkpointing(Exploding())  # only the writer reads state_dict()
    error = ""
    try:
        acc.save_state(folder)
    except (RuntimeError, CheckpointError) as err:
        error = f"{type(err).__name__}: {err}"
    acc.wait_for_everyone()  # both ranks got here: nobody hangs, collectives still pair
    return error


def test_a_failed_save_fails_on_every_rank_and_keeps_the_last(tmp_path: Path) -> None:
    folder = str(tmp_path / "ckpt")
    errors = debug_launcher(_writer_fails, args=(folder,), num_processes=2)
    assert errors[0] == "RuntimeError: disk full"
    assert "rank 0: failed to write its part of the checkpoint" in errors[1]
    names = sorted(p.name for p in Path(folder).iterdir())
    assert "random_states_1.pkl" in names and "notebook_accel.json" in names


def _folders_of_other_names(root: str) -> str:
    import contextlib
    import io
    from datetime import timedelta

    from torch.distributed import distributed_c10d

    os.environ["NOTEBOOK_ACCEL_SAVE_WAIT_WARNING"] = "0.2"
    acc, model, opt, loader, sched = prepared()
    _train(acc, model, opt, loader, 2)
    said = io.StringIO()
    if acc.process_index == 0:
        acc.save_state(os.path.join(root, "tmp_rank0"))
        # Rank 1 waits for a save of its own folder's name: once it has said so, give it one.
        store = distributed_c10d._get_default_store()
        store.wait(["notebook_accel/save_state/waiting/1"], timedelta(minutes=5))
        acc.save_state(os.path.join(root, "tmp_rank1"))
    else:
        with contextlib.redirect_stderr(said):
            acc.save_state(os.path.join(root, "tmp_rank1"))
    acc.wait_for_everyone()
    return said.getvalue()


def test_a_rank_waiting_for_a_folder_of_another_name_says_why(tmp_path: Path) -> None:
    # accelerate's own stateful-loader test saves into a TemporaryDirectory per rank: ours
    # pairs the ranks' calls by the folder's name, so the waiting rank must say so, not hang
    # silently.
    said = debug_launcher(_folders_of_other_names, args=(str(tmp_path),), num_processes=2)
    assert said[0] == ""
    assert "rank 1 has waited 0.2 s for rank 0 to write save_state('.../tmp_rank1')" in said[1]
    assert "a folder of the same name" in said[1]
    assert (tmp_path / "tmp_rank1" / "random_states_1.pkl").is_file()
    assert not (tmp_path / "tmp_rank0" / "random_states_1.pkl").exists()
