"""Experiment trackers with accelerate's names: TensorBoard, MLflow, Weights & Biases, trackio.

    Accelerator(log_with=["tensorboard", ...], project_dir=...)   names checked (ConfigError)
      init_trackers(project, config, init_kwargs)  main process: one tracker per name
      log(values, step)                            main process: every tracker's log()
      get_tracker(name, unwrap)                    the wrapper, or the library's own object
      end_training()                               every tracker's finish()

Each backend is a small class behind one interface (:class:`GeneralTracker`) and talks to its
own library, imported only when the tracker is made. A library that is not installed is a
``ConfigError`` naming the extra to install (``pip install notebook_accel[tensorboard]``).
Users may pass their own ``GeneralTracker`` subclass instances in ``log_with``, as in
accelerate.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..errors import ConfigError
from ..reporting.scalars import scalar

__all__ = [
    "LoggerType",
    "GeneralTracker",
    "TensorBoardTracker",
    "MLflowTracker",
    "WandBTracker",
    "TrackioTracker",
    "resolve",
    "make",
]


class LoggerType(enum.StrEnum):
    """accelerate's tracker names (members compare equal to the strings, so
    ``log_with=LoggerType.TENSORBOARD`` works). The built-in trackers are ALL, TENSORBOARD,
    WANDB, TRACKIO and MLFLOW; the others name accelerate's trackers this package does not
    have (``log_with`` refuses them with a ConfigError)."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"


class GeneralTracker:
    """The interface of a tracker; subclass it for a backend of your own (as in accelerate).

    Attributes:
        name: the name used in ``log_with`` and ``get_tracker``.
        requires_logging_directory: whether it needs ``project_dir``/``logging_dir``.
        main_process_only: only the main process makes and uses it.

    Example:
        >>> class Printer(GeneralTracker):
        ...     name = "printer"
        ...     def log(self, values, step=None, **kwargs):
        ...         print(step, values)
        >>> Printer().log({"loss": 0.5}, step=3)
        3 {'loss': 0.5}
    """

    name: ClassVar[str] = "blank"
    requires_logging_directory: ClassVar[bool] = False
    main_process_only: ClassVar[bool] = True
    accepts_logging_dir: ClassVar[bool] = False

    def __init__(self, _blank: bool = False) -> None:
        self._blank = _blank

    @classmethod
    def create(
        cls, project_name: str, logging_dir: str | None, options: dict[str, Any]
    ) -> GeneralTracker:
        """Make the tracker for ``Accelerator.init_trackers`` (backends that take a folder
        receive ``logging_dir``)."""
        make: Any = cls  # each backend has its library's own signature (as in accelerate)
        if cls.accepts_logging_dir:
            return make(project_name, logging_dir, **options)
        return make(project_name, **options)

    @property
    def tracker(self) -> Any:
        """The library's own object (a ``SummaryWriter``, a W&B run, ...)."""
        return None

    def start(self) -> None:
        """Start the run: ``init_trackers`` calls it on every tracker, before the config is
        stored (accelerate's order; a tracker of your own may open its run here, as
        accelerate's docs suggest). The built-in trackers start when made."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's hyperparameters."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (name -> number) at ``step``."""

    def finish(self) -> None:
        """Flush and close."""


class TensorBoardTracker(GeneralTracker):
    """TensorBoard event files in ``logging_dir/run_name`` (``torch.utils.tensorboard``).

    Numbers become scalars, strings text, dicts of numbers grouped scalars; the config is
    stored as hyperparameters (text ``config`` as JSON too).
    """

    name = "tensorboard"
    requires_logging_directory = True
    accepts_logging_dir = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        from torch.utils.tensorboard import SummaryWriter

        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.writer = SummaryWriter(self.logging_dir, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.add_text("config", json.dumps(values, default=str, indent=1))
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            number = scalar(value)
            if number is not None:
                self.writer.add_scalar(key, number, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, Mapping):
                group = {k: n for k, v in value.items() if (n := scalar(v)) is not None}
                self.writer.add_scalars(key, group, global_step=step, **kwargs)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class MLflowTracker(GeneralTracker):
    """An MLflow run in the experiment ``project_name``, in MLflow's own tracking store.

    The store is MLflow's default (``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the
    working directory, which ``mlflow ui`` opens); ``logging_dir`` is where a new experiment
    keeps its artifacts, as in accelerate.

    Args:
        experiment_name: the experiment (made if MLflow has none of that name).
        logging_dir: a new experiment's artifact location.
        run_id: continue that run instead of starting one (accelerate's).
        tags: the run's tags (a dict, or its JSON).
        nested_run: start the run nested in the active one (``mlflow.start_run(nested=)``).
        run_name: the new run's name.
        description: the run's description.
        kwargs: more of ``mlflow.start_run``'s arguments.
    """

    name = "mlflow"
    accepts_logging_dir = True

    def __init__(
        self,
        experiment_name: str,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool = False,
        run_name: str | None = None,
        description: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        import mlflow

        self.mlflow = mlflow
        experiment = mlflow.get_experiment_by_name(experiment_name)
        if experiment is None:
            location = None if logging_dir is None else os.path.abspath(os.fspath(logging_dir))
            experiment_id = mlflow.create_experiment(experiment_name, artifact_location=location)
        else:
            experiment_id = experiment.experiment_id
        self.active_run = mlflow.start_run(
            run_id=run_id,
            experiment_id=experiment_id,
            run_name=run_name,
            nested=nested_run,
            tags=json.loads(tags) if isinstance(tags, str) else tags,
            description=description,
            **kwargs,
        )

    @property
    def tracker(self) -> Any:
        return self.active_run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        # MLflow refuses parameter values over its length limit: keep their start.
        limit = 6000
        params = {k: str(v)[:limit] for k, v in values.items()}
        self.mlflow.log_params(params)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        numbers_only = {k: n for k, v in values.items() if (n := scalar(v)) is not None}
        if numbers_only:
            self.mlflow.log_metrics(numbers_only, step=step, **kwargs)

    def finish(self) -> None:
        self.mlflow.end_run()


class WandBTracker(GeneralTracker):
    """A Weights & Biases run (``wandb.init(project=...)``); offline with ``WANDB_MODE=offline``.

    Its files go under ``logging_dir`` when there is one (``wandb.init(dir=...)``).
    """

    name = "wandb"
    accepts_logging_dir = True

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__()
        import wandb

        if logging_dir is not None and "dir" not in kwargs:
            os.makedirs(logging_dir, exist_ok=True)
            kwargs["dir"] = os.fspath(logging_dir)
        self.run = wandb.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()


class TrackioTracker(GeneralTracker):
    """A trackio run in the project ``run_name``: a local SQLite store (``trackio show``)."""

    name = "trackio"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        # trackio takes its config at init; a later one updates the run's record.
        self.run.config.update(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.trackio.log(values, step=step, **kwargs)

    def finish(self) -> None:
        self.trackio.finish()


# name -> (class, the module that must be importable, the extra that installs it)
_BACKENDS: dict[str, tuple[type[GeneralTracker], str, str]] = {
    "tensorboard": (TensorBoardTracker, "tensorboard", "tensorboard"),
    "mlflow": (MLflowTracker, "mlflow", "mlflow"),
    "wandb": (WandBTracker, "wandb", "wandb"),
    "trackio": (TrackioTracker, "trackio", "trackio"),
}


def installed(name: str) -> bool:
    """Whether the library behind tracker ``name`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(_BACKENDS[name][1]) is not None
    except (ImportError, ValueError):
        return False


Wanted = str | GeneralTracker


def resolve(log_with: Wanted | Sequence[Wanted] | None) -> list[Wanted]:
    """Check ``log_with``: known names whose library is installed, or tracker instances.

    ``"all"`` is every installed backend (none installed: an empty list).

    Raises:
        ConfigError: an unknown name, or a backend whose library is missing (the message
            names the extra to install).
    """
    if log_with is None:
        return []
    items = [log_with] if isinstance(log_with, str | GeneralTracker) else list(log_with)
    accepted = 'tracker names ("tensorboard", "mlflow", "wandb", "trackio", "all") or trackers'
    wanted: list[Wanted] = []
    for item in items:
        if isinstance(item, GeneralTracker):
            wanted.append(item)
        elif item == "all":
            wanted.extend(name for name in _BACKENDS if installed(name))
        elif isinstance(item, str) and item.lower() in _BACKENDS:
            name = item.lower()
            if not installed(name):
                extra = _BACKENDS[name][2]
                raise ConfigError(
                    "log_with",
                    item,
                    f"a tracker whose library is installed ({name} is not)",
                    f"Install it with: pip install 'notebook_accel[{extra}]'",
                )
            wanted.append(name)
        else:
            raise ConfigError("log_with", item, accepted)
    unique: list[Wanted] = []
    for item in wanted:
        if item not in unique:
            unique.append(item)
    return unique


def make(
    wanted: Wanted,
    project_name: str,
    logging_dir: str | None,
    init_kwargs: Mapping[str, Any],
) -> GeneralTracker:
    """One tracker for ``project_name`` (an instance given by the user is used as it is)."""
    if isinstance(wanted, GeneralTracker):
        return wanted
    cls = _BACKENDS[wanted][0]
    options = dict(init_kwargs.get(wanted, {}))
    if cls.requires_logging_directory and logging_dir is None:
        raise ConfigError(
            "project_dir",
            None,
            f"a folder for {wanted}'s files",
            "Pass Accelerator(project_dir=...) or project_config=ProjectConfiguration(...).",
        )
    return cls.create(project_name, logging_dir, options)
