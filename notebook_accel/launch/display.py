"""The parent's side of the channel: rank-prefixed whole lines, progress bars, the banner.

Output arrives as raw bytes from each worker's stdout/stderr pipe. Bytes are buffered per
(rank, stream) and written out one whole line at a time, so ranks never interleave mid-line.
A carriage return (a text progress bar redrawing itself) keeps only the latest state of the
line. Lines go to the parent's ``sys.stdout``/``sys.stderr`` as they are when the launch
starts: in Jupyter that is the running cell, in a terminal the terminal.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from .channel import Progress

__all__ = ["Display"]

_MAX_LINE = 1 << 16  # a line longer than this is written in pieces


class Display:
    """Writes what the workers say into the notebook cell (or terminal).

    Args:
        output: ``"all"`` ranks' lines, only the ``"main"`` (rank 0) process's, or ``"none"``.
        bars: which ranks' progress bars to draw: ``"main"`` or ``"all"``.
    """

    def __init__(self, output: str = "all", bars: str = "main") -> None:
        self.output = output
        self.bars_mode = bars
        self.stdout: TextIO = sys.stdout
        self.stderr: TextIO = sys.stderr
        self._pending: dict[tuple[int, str], bytes] = {}
        self._bars: dict[tuple[int, int], Any] = {}

    # -- lines ------------------------------------------------------------------------------
    def banner(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def _shows(self, rank: int) -> bool:
        return self.output == "all" or (self.output == "main" and rank == 0)

    def _write(self, rank: int, stream: str, raw: bytes) -> None:
        if not self._shows(rank):
            return
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if "\r" in text:
            text = text.rsplit("\r", 1)[1]
        target = self.stdout if stream == "stdout" else self.stderr
        target.write(f"[rank {rank}] {text}\n")

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        """Take bytes from a worker's stream; write out every completed line."""
        key = (rank, stream)
        buffer = self._pending.get(key, b"") + data
        *lines, rest = buffer.split(b"\n")
        while len(rest) > _MAX_LINE:
            lines.append(rest[:_MAX_LINE])
            rest = rest[_MAX_LINE:]
        for line in lines:
            self._write(rank, stream, line)
        self._pending[key] = rest
        if lines:
            (self.stdout if stream == "stdout" else self.stderr).flush()

    def end(self, rank: int, stream: str) -> None:
        """The stream closed: write what is left of its last line."""
        rest = self._pending.pop((rank, stream), b"")
        if rest:
            self._write(rank, stream, rest)
            (self.stdout if stream == "stdout" else self.stderr).flush()

    # -- progress bars ----------------------------------------------------------------------
    def progress(self, rank: int, message: Progress) -> None:
        if self.bars_mode == "main" and rank != 0:
            return
        key = (rank, message.bar)
        bar = self._bars.get(key)
        if bar is None:
            if message.closed:
                return
            from tqdm.auto import tqdm

            desc = message.desc if self.bars_mode == "main" else f"[rank {rank}] {message.desc}"
            bar = tqdm(total=message.total, desc=desc, unit=message.unit, file=self.stderr,
                       dynamic_ncols=True, **dict(message.options))
            self._bars[key] = bar
        if message.total != bar.total:
            bar.total = message.total
        bar.update(message.n - bar.n)
        if message.closed:
            bar.close()
            del self._bars[key]

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()
