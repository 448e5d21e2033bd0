"""load_state unpickles nothing but tensors and plain data unless the user trusts the folder.

Each test plants, in a real checkpoint folder, a pickle that would create a marker file when
unpickled (what a malicious downloaded checkpoint would do with os.system): in
``scheduler.bin``, ``custom_checkpoint_0.pkl``, a sharded checkpoint's ``.metadata`` and one
of its data values. By default load_state refuses the file, naming it and the opt-in, and the
marker never appears; with ``load_kwargs={"weights_only": False}`` it loads and the marker
appears (the opt-in really unpickles).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from notebook_accel import debug_launcher
from notebook_accel.errors import CheckpointError, ConfigError

OPT_IN = "load_kwargs={'weights_only': False}"
TRUST = {"weights_only": False}


class Planted:
    """Unpickles as ``Path(marker).touch()``: code chosen by whoever wrote the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


class Counter:
    """A registered object (register_for_checkpointing)."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = state["n"]


def _prepared() -> tuple[Any, ...]:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    model, opt, sched = acc.prepare(model, opt, sched)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    return acc, model, opt, sched, counter


@pytest.mark.parametrize("name", ["scheduler.bin", "custom_checkpoint_0.pkl"])
def test_a_planted_pickle_is_refused_unless_trusted(tmp_path: Path, name: str) -> None:
    acc, model, opt, sched, counter = _prepared()
    counter.n = 7
    sched.step()
    folder = acc.save_state(tmp_path / "ckpt")
    marker = tmp_path / "code-ran"
    planted = folder / name
    state = torch.load(planted, weights_only=True)
    torch.save({**state, "planted": Planted(marker)}, planted)

    acc, model, opt, sched, counter = _prepared()
    with pytest.raises(CheckpointError) as refused:
        acc.load_state(folder)
    assert str(planted) in str(refused.value) and OPT_IN in str(refused.value)
    assert "(it names getattr)" in str(refused.value)  # Path.touch, pickled by getattr
    assert not marker.exists()
    assert counter.n == 0

    acc.load_state(folder, load_kwargs=TRUST)
    assert marker.exists()  # the opt-in unpickles whatever the file holds
    assert counter.n == 7 and sched.last_epoch == 1


def test_load_kwargs_weights_only_must_be_a_bool(tmp_path: Path) -> None:
    acc, *_ = _prepared()
    folder = acc.save_state(tmp_path / "ckpt")
    with pytest.raises(ConfigError, match=r"load_kwargs\['weights_only'\]='no'"):
        acc.load_state(folder, load_kwargs={"weights_only": "no"})
    acc.load_state(folder, load_kwargs={"weights_only": True, "map_location": "cpu"})


# ---- a sharded (DCP) checkpoint ------------------------------------------------------------
def _save_sharded(folder: str) -> None:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(fsdp="full")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    acc.backward(model(torch.randn(4, 4)).sum())
    opt.step()
    acc.save_state(folder)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sharded") / "ckpt"
    debug_launcher(_save_sharded, args=(str(folder),), num_processes=2, output="none")
    assert (folder / "sharded" / ".metadata").is_file()
    return folder


def _load_plain(folder: Path, **kwargs: Any) -> Any:
    """One process, a plain module: DCP reshards what two FSDP ranks saved."""
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    acc.load_state(folder, **kwargs)
    return opt


def _copy(folder: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(folder, to)
    return to


def test_sharded_metadata_with_a_planted_pickle_is_refused(sharded: Path, tmp_path: Path) -> None:
    folder = _copy(sharded, tmp_path / "ckpt")
    metadata_file = folder / "sharded" / ".metadata"
    marker = tmp_path / "code-ran"
    metadata = pickle.loads(metadata_file.read_bytes())
    metadata.planted = Planted(marker)
    metadata_file.write_bytes(pickle.dumps(metadata))

    with pytest.raises(CheckpointError) as refused:
        _load_plain(folder)
    assert str(metadata_file) in str(refused.value) and OPT_IN in str(refused.value)
    assert not marker.exists()

    opt = _load_plain(folder, load_kwargs=TRUST)
    assert marker.exists()
    assert all(len(s) == 3 for s in opt.state.values())  # step, exp_avg, exp_avg_sq


def test_a_planted_value_in_sharded_data_is_refused(sharded: Path, tmp_path: Path) -> None:
    # DCP keeps non-tensor values (the optimizer's lr, betas...) as torch.save blobs inside
    # the .distcp files and loads them with weights_only=False itself.
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    folder = _copy(sharded, tmp_path / "ckpt")
    metadata_file = folder / "sharded" / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())
    index = next(i for i in metadata.storage_data if i.fqn.endswith("param_groups.0.lr"))
    info = metadata.storage_data[index]
    data_file = folder / "sharded" / info.relative_path
    marker = tmp_path / "code-ran"
    blob = io.BytesIO()
    torch.save([0.01, Planted(marker)], blob)
    offset = data_file.stat().st_size
    with open(data_file, "ab") as out:
        out.write(blob.getvalue())
    metadata.storage_data[index] = _StorageInfo(info.relative_path, offset, len(blob.getvalue()))
    metadata_file.write_bytes(pickle.dumps(metadata))

    with pytest.raises(CheckpointError) as refused:
        _load_plain(folder)
    assert "param_groups.0.lr" in str(refused.value) and OPT_IN in str(refused.value)
    assert not marker.exists()
