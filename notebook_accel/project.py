"""ProjectConfiguration: where a run writes its checkpoints and logs (accelerate's names).

Example:
    >>> from notebook_accel import Accelerator, ProjectConfiguration
    >>> config = ProjectConfiguration(project_dir="runs/exp1", total_limit=3)
    >>> accelerator = Accelerator(project_config=config)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
        save_on_each_node: every machine writes what it holds (not only machine 0).
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
