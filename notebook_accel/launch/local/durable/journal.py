"""A job's kept output, on disk and bounded: what an attaching kernel replays before the live
part, and what ``job.output`` reads after the job ended.

    Recorder (the job's display, in the supervisor)
      -> each event pickled, as a frame (4-byte length + bytes), appended to <n>.log
         <n>.log past SEGMENT bytes -> becomes <n>.old (the previous .old dropped): the job
         keeps its latest 2 x SEGMENT bytes
      -> read(): a Dropped event first if a segment was dropped, then <n>.old + <n>.log,
         whole frames, oldest first

Written and read by the supervisor alone, in the session's 0700 folder; the frames reach a
kernel only over a proven connection (link.py).
"""

from __future__ import annotations

import pickle
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SEGMENT", "Dropped", "Journal", "frames"]

SEGMENT = 32 << 20  # bytes per segment: a job keeps its latest 64 MiB of output


@dataclass(frozen=True)
class Dropped:
    """Output a job's journal no longer holds (its bound, 2 x SEGMENT bytes, was reached)."""

    segments: int  # how many segments were dropped so far


class Journal:
    """One job's events: appended as they come, read back whole (``read``)."""

    def __init__(self, base: Path, segment: int = SEGMENT) -> None:
        self._log = base.with_suffix(".log")
        self._old = base.with_suffix(".old")
        self._segment = segment
        self._dropped = 0
        self._lock = threading.Lock()
        self._file = open(self._log, "ab")  # noqa: SIM115  (open for the job's life)

    def append(self, event: Any) -> bytes:
        """Keep ``event``; its frame (what a live watcher is sent)."""
        data = pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
        frame = struct.pack(">I", len(data)) + data
        with self._lock:
            if self._file.tell() + len(frame) > self._segment and self._file.tell() > 0:
                self._rotate()
            self._file.write(frame)
            self._file.flush()
        return frame

    def _rotate(self) -> None:
        self._file.close()
        if self._old.exists():
            self._dropped += 1
        self._log.replace(self._old)
        self._file = open(self._log, "ab")  # noqa: SIM115

    def read(self) -> bytes:
        """Every frame kept, oldest first."""
        with self._lock:
            self._file.flush()
            old = self._old.read_bytes() if self._old.exists() else b""
            kept = old + self._log.read_bytes()
        if not self._dropped:
            return kept
        data = pickle.dumps(Dropped(self._dropped), protocol=pickle.HIGHEST_PROTOCOL)
        return struct.pack(">I", len(data)) + data + kept

    def close(self) -> None:
        with self._lock:
            self._file.close()


def frames(data: bytes) -> list[Any]:
    """The events in ``data`` (frames as ``Journal`` writes them)."""
    events, at = [], 0
    while at + 4 <= len(data):
        (size,) = struct.unpack(">I", data[at : at + 4])
        events.append(pickle.loads(data[at + 4 : at + 4 + size]))  # noqa: S301  (proven peer)
        at += 4 + size
    return events
