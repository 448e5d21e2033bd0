"""Trackers with the real libraries, offline: what a 2-process launch logged is read back.

Each test launches 2 CPU processes; only rank 0 writes (accelerate's behaviour), so every
store holds exactly one run with the logged steps and values.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from notebook_accel import GeneralTracker, debug_launcher
from notebook_accel.errors import ConfigError
from notebook_accel.training.accelerator import Accelerator

LOSSES = [1.0, 0.5, 0.25, 0.125]


def train_and_log(log_with: str, project_dir: str | None) -> dict[str, Any]:
    accelerator = Accelerator(log_with=log_with, project_dir=project_dir)
    accelerator.init_trackers("proj", config={"lr": 0.1, "layers": 2})
    for step, loss in enumerate(LOSSES):
        accelerator.log({"loss": loss, "acc": 1 - loss}, step=step * 10)
    tracker = accelerator.get_tracker(log_with)
    unwrapped = accelerator.get_tracker(log_with, unwrap=True)
    out = {
        "rank": accelerator.process_index,
        "tracker": type(tracker).__name__,
        "unwrapped": type(unwrapped).__name__ if unwrapped is not None else None,
        "started": len(accelerator.trackers),
    }
    accelerator.end_training()
    return out


def _check_ranks(results: list[dict[str, Any]], cls: str) -> None:
    assert results[0]["tracker"] == cls and results[0]["started"] == 1
    # Other ranks start nothing and get a blank tracker, as in accelerate.
    assert results[1]["tracker"] == "GeneralTracker" and results[1]["started"] == 0


def test_tensorboard_event_files_hold_the_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    results = debug_launcher(train_and_log, args=("tensorboard", str(tmp_path)))
    _check_ranks(results, "TensorBoardTracker")
    assert results[0]["unwrapped"] == "SummaryWriter"
    events = EventAccumulator(str(tmp_path / "proj"))
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("loss")]
    acc = [(e.step, e.value) for e in events.Scalars("acc")]
    assert loss == [(i * 10, v) for i, v in enumerate(LOSSES)]
    assert acc == [(i * 10, 1 - v) for i, v in enumerate(LOSSES)]
    assert "config" in str(events.Tags())


def test_mlflow_default_store_read_back_through_its_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    monkeypatch.chdir(tmp_path)  # MLflow's default store: ./mlflow.db
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = debug_launcher(train_and_log, args=("mlflow", str(tmp_path / "artifacts")))
    _check_ranks(results, "MLflowTracker")
    import mlflow

    assert (tmp_path / "mlflow.db").exists()
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("proj")
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(i * 10, v) for i, v in enumerate(LOSSES)]
    assert run.data.params == {"lr": "0.1", "layers": "2"}
    assert run.info.status == "FINISHED"


def _wandb_records(path: Path) -> list[Any]:
    """The records of a W&B transaction log (``run-*.wandb``): LevelDB's log format.

    32 KiB blocks of chunks: crc32 (4 bytes), length (2), type (1: whole, 2-4: first, middle,
    last), data; the file starts with a 7-byte W&B header.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, offset, block = [], b"", 7, 32768
    while offset + 7 <= len(data):
        left = block - offset % block
        if left < 7:
            offset += left  # block trailer
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def test_wandb_offline_run_files_hold_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    import json

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    results = debug_launcher(train_and_log, args=("wandb", str(tmp_path)))
    _check_ranks(results, "WandBTracker")
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")  # one run: rank 0's
    history = []
    config: dict[str, Any] = {}
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            row.setdefault("_step", record.history.step.num)
            history.append(row)
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    logged = [(h["_step"], h["loss"], h["acc"]) for h in history if "loss" in h]
    assert logged == [(i * 10, v, 1 - v) for i, v in enumerate(LOSSES)]
    assert config["lr"] == 0.1 and config["layers"] == 2


def test_trackio_local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("trackio")
    import importlib

    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    import trackio.utils

    # It reads TRACKIO_DIR when imported, and the workers are forks of this process made at
    # the launch (forkserver.renew): a module imported here comes as it is here, as with
    # accelerate's fork launcher. Read again now, it has the test's folder in both.
    importlib.reload(trackio.utils)
    from trackio import sqlite_storage

    importlib.reload(sqlite_storage)
    results = debug_launcher(train_and_log, args=("trackio", None))
    _check_ranks(results, "TrackioTracker")
    storage = sqlite_storage.SQLiteStorage
    assert storage.get_project_db_path("proj").parent == tmp_path / "trackio"
    (run,) = storage.get_runs("proj")
    logs = storage.get_logs("proj", run)
    assert [(row["step"], row["loss"]) for row in logs] == [
        (i * 10, v) for i, v in enumerate(LOSSES)
    ]


def test_unknown_tracker_and_missing_library_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="log_with") as err:
        Accelerator(log_with="comet")
    assert "tensorboard" in err.value.accepted
    from notebook_accel.training import trackers as tracking

    missing = "tensorboard"
    monkeypatched = dict(tracking._BACKENDS)
    try:
        # A backend whose module cannot be found: the error names the extra to install.
        tracking._BACKENDS[missing] = (tracking.TensorBoardTracker, "no_such_module_xyz", missing)
        with pytest.raises(ConfigError, match=r"notebook_accel\[tensorboard\]"):
            Accelerator(log_with=["tensorboard"])
    finally:
        tracking._BACKENDS.clear()
        tracking._BACKENDS.update(monkeypatched)


def test_tensorboard_needs_a_folder_and_get_tracker_names_the_started() -> None:
    accelerator = Accelerator(log_with="tensorboard")
    with pytest.raises(ConfigError, match="project_dir"):
        accelerator.init_trackers("proj")
    with pytest.raises(ConfigError, match="get_tracker"):
        accelerator.get_tracker("wandb")


def test_all_means_every_installed_backend_and_custom_trackers_are_used() -> None:
    from notebook_accel.training import trackers as tracking

    installed = [name for name in ("tensorboard", "mlflow", "wandb", "trackio")]
    expected = [name for name in installed if tracking.installed(name)]
    assert tracking.resolve("all") == expected

    class Remember(GeneralTracker):
        name = "remember"

        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[int | None, dict[str, Any]]] = []

        def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
            self.seen.append((step, values))

    mine = Remember()
    accelerator = Accelerator(log_with=[mine])
    accelerator.init_trackers("proj")
    accelerator.log({"loss": 0.5}, step=1)
    assert mine.seen == [(1, {"loss": 0.5})]
    assert accelerator.get_tracker("remember") is mine


def test_mlflow_continues_a_run_nests_one_and_describes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate 1.16's MLflowTracker parameters: run_id, nested_run, description, tags."""
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    import mlflow

    from notebook_accel.tracking import MLflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    first = MLflowTracker("exp", tmp_path / "art", tags='{"team": "a"}', description="first")
    run_id = first.tracker.info.run_id
    first.log({"loss": 1.0}, step=0)
    first.finish()
    again = MLflowTracker("exp", run_id=run_id)
    again.log({"loss": 0.5}, step=1)
    parent = again.tracker.info.run_id
    child = MLflowTracker("exp", nested_run=True, run_name="child")
    child_id = child.tracker.info.run_id
    child.finish()
    again.finish()
    client = mlflow.MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(run_id, "loss")
    assert parent == run_id and [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5)]
    run = client.get_run(run_id)
    assert run.data.tags["team"] == "a" and run.data.tags["mlflow.note.content"] == "first"
    nested = client.get_run(child_id)
    assert nested.data.tags["mlflow.parentRunId"] == run_id
    assert nested.info.run_name == "child"
