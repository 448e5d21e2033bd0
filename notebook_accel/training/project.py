"""ProjectConfiguration: where a run writes its checkpoints and logs (accelerate's names).

Example:
    >>> from notebook_accel import Accelerator, ProjectConfiguration
    >>> config = ProjectConfiguration(project_dir="runs/exp1", total_limit=3)
    >>> accelerator = Accelerator(project_config=config)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProjectConfiguration"]


@dataclass
class ProjectConfiguration:
    """Where checkpoints and logs go.

    Args:
        project_dir: the run's folder (``None``: the working directory).
        logging_dir: where trackers write (``None``: ``project_dir``).
        automatic_checkpoint_naming: ``save_state()`` without a folder writes
            ``project_dir/checkpoints/checkpoint_<iteration>``.
        total_limit: keep at most this many automatic checkpoints (oldest removed first).
        iteration: the number of the next automatic checkpoint.
        save_on_each_node: every machine's local main process writes a full checkpoint (and
            ``Accelerator.save`` a file), not only the main process: for machines whose disks
            are not shared.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.project_dir is not None:
            self.project_dir = os.fspath(self.project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        else:
            self.logging_dir = os.fspath(self.logging_dir)

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        """Set ``project_dir`` (and ``logging_dir`` with it, as accelerate does)."""
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        self.logging_dir = self.project_dir

    # ---- automatic checkpoint naming -------------------------------------------------------
    @property
    def checkpoints_dir(self) -> Path:
        """``project_dir/checkpoints`` (the working directory's when project_dir is None)."""
        return Path(self.project_dir or ".") / "checkpoints"

    def checkpoints(self) -> list[Path]:
        """The ``checkpoint_<n>`` folders in :attr:`checkpoints_dir`, oldest (lowest n) first."""
        if not self.checkpoints_dir.is_dir():
            return []
        found = [
            p for p in self.checkpoints_dir.iterdir() if _NAME.fullmatch(p.name) and p.is_dir()
        ]
        return sorted(found, key=lambda p: int(p.name.rsplit("_", 1)[1]))

    def next_checkpoint(self) -> Path:
        """``checkpoints/checkpoint_<iteration>``."""
        return self.checkpoints_dir / f"checkpoint_{self.iteration}"

    def make_room(self) -> list[Path]:
        """Remove the oldest automatic checkpoints so that one more fits in ``total_limit``."""
        if self.total_limit is None:
            return []
        existing = self.checkpoints()
        doomed = existing[: max(0, len(existing) + 1 - self.total_limit)]
        for folder in doomed:
            shutil.rmtree(folder, ignore_errors=True)
        return doomed

    def latest_checkpoint(self) -> Path | None:
        """The newest ``checkpoint_<n>`` folder, or None."""
        found = self.checkpoints()
        return found[-1] if found else None


# Our staging folders (".checkpoint_3.saving") sit beside the checkpoints and are not counted.
_NAME = re.compile(r"checkpoint_\d+")
