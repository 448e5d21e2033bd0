"""show/rich.py's bookkeeping of what ranks display, as a cell keeps its outputs: each rank's
outputs in order, updates by the rank's display ids, clear_output clearing the rank's own (at
once, or when its next display comes), and an area drawn whole as one bundle. (What reaches a
real cell: tests/launch/show/test_rank_displays.py.)"""

from __future__ import annotations

import json
from typing import Any

from notebook_accel.launch.show.rich import Areas, caption, merged, outputs
from notebook_accel.reporting.channel import Displayed


def _show(html: str, display_id: str | None = None, update: bool = False) -> Displayed:
    data = {"text/plain": html, "text/html": html}
    return Displayed(data=json.dumps(data), display_id=display_id, update=update)


def _state(areas: Areas, rank: int) -> list[Any]:
    return [None if s.data is None else s.data["text/html"] for s in areas.slots(rank)]


def test_updates_reach_only_the_outputs_the_rank_named() -> None:
    areas = Areas()
    areas.apply(0, _show("a", "x"))
    areas.apply(0, _show("b"))
    areas.apply(1, _show("c", "x"))  # the same id on another rank: another output
    [(slot, new)] = areas.apply(0, _show("a2", "x", update=True))
    assert not new and slot.data is not None and slot.data["text/html"] == "a2"
    assert areas.apply(0, _show("?", "unknown", update=True)) == []
    assert _state(areas, 0) == ["a2", "b"] and _state(areas, 1) == ["c"]
    keys = {s.key for rank in (0, 1) for s in areas.slots(rank)}
    assert len(keys) == 3  # each output its own id in the cell


def test_clear_output_clears_the_rank_s_outputs_and_the_next_display_takes_their_place() -> None:
    areas = Areas()
    areas.apply(0, _show("a", "x"))
    areas.apply(0, _show("b"))
    areas.apply(1, _show("other rank"))
    cleared = areas.apply(0, Displayed(clear=True))
    assert [new for _, new in cleared] == [False, False] and _state(areas, 0) == [None, None]
    assert areas.apply(0, _show("ignored", "x", update=True)) == []  # its id went with it
    [(slot, new)] = areas.apply(0, _show("c"))
    assert not new and _state(areas, 0) == ["c", None]  # in the first one's place
    assert _state(areas, 1) == ["other rank"]


def test_clear_output_wait_clears_when_the_next_display_comes() -> None:
    areas = Areas()
    areas.apply(0, _show("frame 0"))
    areas.apply(0, _show("legend"))
    assert areas.apply(0, Displayed(clear=True, wait=True)) == []
    assert _state(areas, 0) == ["frame 0", "legend"]  # nothing cleared yet
    changed = areas.apply(0, _show("frame 1"))
    assert _state(areas, 0) == ["frame 1", None]
    assert sorted(s.data is None for s, _ in changed) == [False, True]
    areas.apply(0, Displayed(clear=True, wait=True))
    assert [s.data for s, _ in areas.finish()] == [None]  # the end clears what waited
    assert _state(areas, 0) == [None, None]


def test_an_area_drawn_whole() -> None:
    areas = Areas()
    areas.apply(0, Displayed(data=json.dumps({"text/plain": "fig", "image/png": "iVBOR"})))
    assert merged(areas, marked=False) == {"text/plain": "fig", "image/png": "iVBOR"}
    bundle = merged(areas, marked=True)
    assert bundle["text/html"].startswith(caption(0)["text/html"])
    assert '<img src="data:image/png;base64,iVBOR"/>' in bundle["text/html"]
    areas.apply(1, _show("<b>rank 1</b>"))
    assert [o["data"] for o in outputs(areas, marked=False)][1]["text/html"] == "<b>rank 1</b>"
    assert len(outputs(areas, marked=True)) == 4  # two captions, two displays
