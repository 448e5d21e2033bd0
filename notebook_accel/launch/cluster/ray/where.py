"""The stall report's look at a Ray launch's ranks: the question through Ray's key-value
store, each answer back with the rank's output.

    notebook (driver.py, RayRanks)                    each rank's task (ranks.py, Asked)
    ------------------------------                    ---------------------------------
    ask(): every rank has met (Placed)?
      the question's count + 1 -> Ray's KV  ---->     reads the count at most every half
      store ("<launch key>/where")                    second, between two batches of its
                                                      output; a new count: a snapshot of its
                                                      threads (rank/where.py) and its CPU
                                                      share since the last read
                                            <----     Where, in its next Output batch
                                                      (display.report -> the watch's answer)
    report(): each rank's answer, else what the
      driver knows (returned, raised, died,
      did not answer), its pid and node

The ranks may be on other machines, so nothing is read from outside them (no /proc, no
signal, no py-spy): a rank whose interpreter is held inside a C call cannot answer and the
report says so. A launch that never stalls pays one key-value read per rank every half second,
on the task's own thread, never the function's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from ....private import ray as private_ray
from ....reporting.channel import Where
from ...wire.where import RankView, report
from .ranks import KV_NAMESPACE, question_key

__all__ = ["RayRanks"]


class RayRanks:
    """The stall report's side of a Ray launch (show/stall.Ranks).

    Args:
        key: the launch's key in Ray's key-value store (the question is beside it).
        ranks: what the driver knows of each rank now, as the report's views without an
            answer (state "starting": it has not met the others, it cannot answer yet).
        origins: the payload's cell-defined functions and their files.
        patience: seconds to wait for the answers: a rank reads the question every
            half second between batches of output (a batch waits a second at most), then
            its answer travels with its output.
    """

    def __init__(
        self,
        key: str,
        ranks: Callable[[], list[RankView]],
        origins: Iterable[tuple[str, str]],
        patience: float = 4.0,
    ) -> None:
        self.key = question_key(key)
        self.ranks = ranks
        self.origins = tuple(origins)
        self.patience = patience
        self._count = 0
        self._looked: list[RankView] = []

    def ask(self) -> set[int] | None:
        self._looked = self.ranks()
        if any(r.state == "starting" for r in self._looked):
            return None
        running = {r.rank for r in self._looked if r.state == "running"}
        if running:
            self._count += 1
            private_ray.kv_put(self.key, str(self._count), KV_NAMESPACE)
        return running

    def report(self, answers: dict[int, Where], head: str, native: float | None) -> str:
        views = []
        for view in self._looked:
            where = answers.get(view.rank) if view.state == "running" else None
            if where is not None:
                view = dataclasses.replace(view, where=where, cpu=where.busy)
            views.append(view)
        return report(views, self.origins, head)

    def close(self) -> None:
        """Delete the question (the launch's end)."""
        if self._count:
            private_ray.kv_del(self.key, KV_NAMESPACE)
