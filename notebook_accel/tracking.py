"""``accelerate.tracking``'s names, for code ported with only its imports changed.

``from accelerate.tracking import WandBTracker`` becomes
``from notebook_accel.tracking import WandBTracker``; the trackers live on the training side
(``training/tracking.py``) and load on first use, so this module imports no torch;
accelerate's re-exports of ``accelerate.utils`` names resolve as in
:mod:`notebook_accel.utils` (provided or refused).
"""

from __future__ import annotations

from typing import Any

from .refusals import REFUSED, UTILS, shim_attribute

_TRACKING = "notebook_accel.training.tracking"
_FROM_UTILS = (
    "LoggerType compare_versions is_aim_available is_clearml_available is_comet_ml_available "
    "is_dvclive_available is_mlflow_available is_swanlab_available is_tensorboard_available "
    "is_trackio_available is_wandb_available listify str_to_bool"
).split()
# name -> module; __all__ is built from it
_EXPORTS = {
    **dict.fromkeys(
        "GeneralTracker MLflowTracker TensorBoardTracker TrackioTracker WandBTracker".split(),
        _TRACKING,
    ),
    "PartialState": "notebook_accel.training.processes",
    "get_logger": "notebook_accel.training.logs",
    **dict.fromkeys(_FROM_UTILS, UTILS),
}
__all__ = sorted(_EXPORTS)  # and REFUSED[__name__]'s placeholders, in dir()


def __getattr__(name: str) -> Any:
    return shim_attribute(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted({*__all__, *REFUSED[__name__]})
