"""What ranks display, kept per rank as a cell keeps its outputs, and drawn in the notebook.

    Displayed from rank r (the engine, in order with r's lines: output marks)
      -> Areas.apply: r's area, its outputs (slots) in the order they appeared, the rank's
         display ids naming them, a clear_output(wait=True) waiting for r's next display
      -> the changed slots, drawn by the display that owns the Areas:
           a running cell (CellOutputs): one cell output per slot, made where the rank first
             displayed it (display_data), changed in place (update_display_data, by an id of
             ours: ranks' ids never meet, nor a later launch's); a cleared slot is blanked,
             and the rank's next display takes its place
           a finished cell (show/background.py), the panel (faces/panel.py): every rank's
             displays drawn whole (``merged``) into a display made at submit, the panel's
             HTML area

``clear_output`` in a rank clears what that rank displayed, not the cell: the banner, the
other ranks' lines and displays, the bars and the chart stay. ``output="all"`` marks each
display with its rank (a small caption above it); ``"main"`` shows rank 0's only, unmarked.
"""

from __future__ import annotations

import html
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...reporting.channel import Displayed

__all__ = ["Areas", "CellOutputs", "Slot", "caption", "merged", "outputs"]

_BLANK: dict[str, Any] = {"text/plain": ""}


@dataclass
class Slot:
    """One output of a rank's area: what it shows now (``None``: cleared, free again)."""

    key: str  # our display id of its output (caption: key + "-rank")
    rank: int
    data: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)  # the rank's display ids naming it


@dataclass
class _Area:
    slots: list[Slot] = field(default_factory=list)
    clear_waits: bool = False  # clear_output(wait=True): cleared when the next display comes


class Areas:
    """Every rank's area of one display (a launch, a session's task)."""

    def __init__(self) -> None:
        self._areas: dict[int, _Area] = {}
        self._launch = uuid.uuid4().hex[:12]

    def slots(self, rank: int) -> list[Slot]:
        """The rank's outputs, in the order they appeared (cleared ones included)."""
        area = self._areas.get(rank)
        return [] if area is None else list(area.slots)

    def ranks(self) -> list[int]:
        return sorted(self._areas)

    def apply(self, rank: int, message: Displayed) -> list[tuple[Slot, bool]]:
        """Take one message of ``rank``: the slots it changed, each with whether it is new."""
        area = self._areas.setdefault(rank, _Area())
        if message.clear:
            if message.wait:
                area.clear_waits = True
                return []
            return [(slot, False) for slot in _clear(area)]
        data, metadata = message.bundle()
        if message.update:
            named = message.display_id
            changed = [s for s in area.slots if s.data is not None and named in s.names]
            for slot in changed:
                slot.data, slot.metadata = data, metadata
            return [(slot, False) for slot in changed]
        cleared = _clear(area) if area.clear_waits else []
        area.clear_waits = False
        free = next((s for s in area.slots if s.data is None), None)
        slot = free or Slot(f"notebook-accel-{self._launch}-{rank}-{len(area.slots)}", rank)
        if free is None:
            area.slots.append(slot)
        slot.data, slot.metadata = data, metadata
        slot.names = {message.display_id} if message.display_id is not None else set()
        changes = [(s, False) for s in cleared if s is not slot]
        changes.append((slot, free is None))
        return changes

    def finish(self) -> list[tuple[Slot, bool]]:
        """The end: a clear that waited for a next display clears now."""
        changes: list[tuple[Slot, bool]] = []
        for area in self._areas.values():
            if area.clear_waits:
                area.clear_waits = False
                changes.extend((slot, False) for slot in _clear(area))
        return changes


def _clear(area: _Area) -> list[Slot]:
    cleared = [s for s in area.slots if s.data is not None]
    for slot in cleared:
        slot.data, slot.metadata, slot.names = None, {}, set()
    return cleared


def caption(rank: int) -> dict[str, Any]:
    """The mark above a rank's display under ``output="all"``."""
    return {
        "text/plain": f"[rank {rank}]",
        "text/html": (
            '<div class="notebook-accel-rank-mark" style="font-size:smaller;opacity:0.7">'
            f"[rank {rank}]</div>"
        ),
    }


class CellOutputs:
    """Slots as outputs of the running cell (IPython's display, with our display ids)."""

    def __init__(self, marked: bool) -> None:
        self.marked = marked

    def draw(self, slot: Slot, new: bool) -> None:
        from IPython.display import display

        data = _BLANK if slot.data is None else slot.data
        mark = _BLANK if slot.data is None else caption(slot.rank)
        if self.marked:
            display(mark, raw=True, display_id=slot.key + "-rank", update=not new)
        display(data, raw=True, metadata=slot.metadata, display_id=slot.key, update=not new)


def outputs(areas: Areas, marked: bool) -> list[dict[str, Any]]:
    """Every rank's displays as a notebook's outputs (nbformat's display_data), rank by rank,
    each rank's under its caption when ``marked``."""
    shown: list[dict[str, Any]] = []
    for rank in areas.ranks():
        slots = [s for s in areas.slots(rank) if s.data is not None]
        if slots and marked:
            shown.append(_output(caption(rank), {}))
        shown.extend(_output(s.data, s.metadata) for s in slots if s.data is not None)
    return shown


def _output(data: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    return {"output_type": "display_data", "data": data, "metadata": metadata}


def merged(areas: Areas, marked: bool) -> dict[str, Any]:
    """Every rank's displays as one mimebundle, to rewrite a display made beforehand (a
    background job's, in its submitting cell; the panel's area): a lone display as it is, else
    each one as HTML under the other (images inline), rank by rank, each rank's under its
    caption when ``marked``."""
    shown = outputs(areas, marked)
    if not shown:
        return dict(_BLANK)
    if len(shown) == 1:
        return dict(shown[0]["data"])
    return {
        "text/plain": "\n".join(str(o["data"].get("text/plain", "")) for o in shown),
        "text/html": "".join(_as_html(o["data"]) for o in shown),
    }


_IMAGES = ("image/png", "image/jpeg", "image/gif")


def _as_html(data: dict[str, Any]) -> str:
    """One output of an area as HTML (what a notebook would show of it)."""
    if "text/html" in data:
        return str(data["text/html"])
    for kind in _IMAGES:
        if kind in data:
            return f'<img src="data:{kind};base64,{data[kind]}"/>'
    if "image/svg+xml" in data:
        return str(data["image/svg+xml"])
    if "application/json" in data:
        return f"<pre>{html.escape(json.dumps(data['application/json'], indent=1))}</pre>"
    text = data.get("text/markdown") or data.get("text/latex") or data.get("text/plain", "")
    return f"<pre>{html.escape(str(text))}</pre>"
