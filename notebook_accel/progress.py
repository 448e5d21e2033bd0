"""Worker-side progress: reports to the parent, which draws the bars.

Outside a launch (no channel attached) ``tqdm`` here is ``tqdm.auto.tqdm``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .launch.channel import Sender

__all__ = ["attach", "detach", "channel"]

# One channel per worker process: set by the worker entry point, read by the bars it creates.
_channel: Sender | None = None


def attach(sender: Sender) -> None:
    global _channel
    _channel = sender


def detach() -> None:
    global _channel
    _channel = None


def channel() -> Sender | None:
    return _channel
