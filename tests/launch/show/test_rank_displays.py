"""What a rank displays reaches the cell: each kind (HTML, an update by id, clear_output, a
matplotlib PNG, a DataFrame) from rank 0 (``output="main"``) and from every rank
(``output="all"``, each display under its rank's caption), in a launch, a session's run and a
background job, in a real kernel (nbclient), in order with the rank's lines. Library bars
(tqdm.auto, tqdm.notebook) draw as the notebook's bars, an ipywidget is refused with one line,
nothing of the kernel leaks out of a worker, a launch returning only None shows nothing.

The forkserver is a fork of the kernel (torch imported first); the fresh-interpreter forkserver
(the branch a notebook with CUDA in use takes, forced here on CPU as test_warm_up.py does)
runs the launches again.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import kernelspec

pytestmark = pytest.mark.slow

KINDS = ("html", "update", "clear", "png", "dataframe")
HAS_PANDAS = importlib.util.find_spec("pandas") is not None

# Where the forkserver comes from: a fork of the kernel (torch imported first), or a fresh
# interpreter (CUDA in use in the notebook: forced, its check answering "in use").
FRESH = (
    "from notebook_accel.launch.local import forkserver as warm\n"
    "warm._cuda_initialised = lambda: True\n"
)
SETUP = """\
import logging, os, time
from pathlib import Path
import torch
import tqdm.auto
logging.basicConfig(format="%(levelname)s:%(name)s:%(message)s")  # a handler of the notebook's
{fresh}from notebook_accel import Workers, debug_launcher, notebook_launcher
"""
SHOW = """\
def show(kind):
    import os
    from IPython.display import HTML, clear_output, display, update_display
    rank = int(os.environ["RANK"])
    print(f"before {kind}")
    if kind == "html":
        display(HTML(f"<b>html from rank {rank}</b>"))
    elif kind == "update":
        handle = display(HTML(f"<i>first {rank}</i>"), display_id=True)
        display(HTML(f"<i>named {rank}</i>"), display_id="named")
        print("between")
        handle.update(HTML(f"<i>second {rank}</i>"))
        update_display(HTML(f"<i>renamed {rank}</i>"), display_id="named")
    elif kind == "clear":
        display(HTML(f"<i>gone {rank}</i>"))
        clear_output()
        for frame in range(4):
            clear_output(wait=True)
            display(HTML(f"<i>frame {frame} of {rank}</i>"))
    elif kind == "png":
        import matplotlib.pyplot as plt
        plt.plot([0, rank + 1])
        plt.show()
    elif kind == "dataframe" and HAS_PANDAS:
        import pandas as pd
        display(pd.DataFrame({"rank": [rank], "square": [rank * rank]}))
    print(f"after {kind}")

"""
LIBRARIES = """\
def libraries():
    import logging
    import ipywidgets
    logging.getLogger("a.library").warning("a library's warning")
    from IPython.display import display
    from tqdm.auto import tqdm as auto_bar
    from tqdm.notebook import tqdm as notebook_bar
    for _ in auto_bar(range(30), desc="auto bar"):
        pass
    for _ in notebook_bar(range(20), desc="notebook bar"):
        pass
    display(ipywidgets.IntSlider())
    display(ipywidgets.IntSlider())  # one line, not one per widget
    try:
        from rich.console import Console
    except ImportError:
        return
    Console().print("[bold]rich text[/bold]")  # rich's notebook rendering: HTML
notebook_launcher(libraries, num_processes=2)
"""
# the launch panel, launched from code: what the ranks displayed, as its displays area holds it
PANEL = """\
from notebook_accel import LaunchPanel
panel = LaunchPanel(show, args=("update",))
panel.processes.value = 2
panel.launch()
panel.wait(120)
panel.displays.value
"""
LAST_VALUES = """\
%%distributed
import matplotlib.pyplot as plt
figure, axes = plt.subplots()
axes.plot([0, 1, 4])
plt.close(figure)
figure
"""


def _launches(fresh: bool) -> dict[str, str]:
    cells = {
        "setup": SETUP.format(fresh=FRESH if fresh else ""),
        "show": f"HAS_PANDAS = {HAS_PANDAS}\n" + SHOW,
    }
    for output in ("all",) if fresh else ("main", "all"):
        for kind in KINDS:
            cells[f"launch {kind} {output}"] = (
                f"notebook_launcher(show, args=({kind!r},), num_processes=2, output={output!r})"
            )
    cells["libraries"] = LIBRARIES
    if not fresh:
        cells["panel"] = PANEL
        cells["debug html all"] = "debug_launcher(show, args=('html',))"
    return cells


def _sessions(gate: Path) -> dict[str, str]:
    cells: dict[str, str] = {}
    for output in ("main", "all"):
        cells[f"open {output}"] = f'w = Workers(num_processes=2, hardware="cpu", output={output!r})'
        for kind in KINDS:
            cells[f"run {kind} {output}"] = f"w.run(show, {kind!r})"
        # the job's second half waits for the next cell, which runs while the job does
        cells[f"submit {output}"] = (
            "def job_body(gate):\n"
            "    show('clear')  # first: a clear_output clears every display of its rank\n"
            "    while not Path(gate).exists():\n"
            "        time.sleep(0.01)\n"
            "    for kind in ('html', 'update', 'png', 'dataframe'):\n"
            "        show(kind)\n"
            f"job = w.submit(job_body, {str(gate) + output!r})"
        )
        cells[f"meanwhile {output}"] = (
            f"print('meanwhile', job.done())\nPath({str(gate) + output!r}).touch()"
        )
        cells[f"result {output}"] = "job.result(timeout=120)"
        if output == "all":
            cells["load magic"] = "%load_ext notebook_accel"
            cells["last value"] = LAST_VALUES
        cells[f"close {output}"] = "w.close()"
    cells["all none"] = "notebook_launcher(print, args=('returns None',), num_processes=2)"
    return cells


def _run(cells: dict[str, str]) -> dict[str, Any]:
    ran = kernelspec.run_cells(list(cells.values()), timeout=lambda cell: 180)
    return dict(zip(cells, ran, strict=True))


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with kernelspec.selected(tmp_path_factory.mktemp("jupyter")):
        yield


@pytest.fixture(scope="module")
def forked(kernel_env: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    gate = tmp_path_factory.mktemp("gate") / "open-"
    return _run({**_launches(fresh=False), **_sessions(gate)})


@pytest.fixture(scope="module")
def fresh(kernel_env: None) -> dict[str, Any]:
    return _run(_launches(fresh=True))


# -- reading a cell as a user sees it ---------------------------------------------------------


def _items(cell: Any) -> list[tuple[str, Any]]:
    """The cell's outputs in order: ("line", text) per printed line, ("display", data)."""
    items: list[tuple[str, Any]] = []
    for output in cell.outputs:
        if output["output_type"] == "stream":
            items.extend(("line", line) for line in output["text"].splitlines())
        elif output["output_type"] == "display_data":
            items.append(("display", output["data"]))
    return items


def _html(data: dict[str, Any]) -> str:
    return str(data.get("text/html", ""))


def _index(items: list[tuple[str, Any]], kind: str, text: str) -> int:
    found = [
        i
        for i, (what, value) in enumerate(items)
        if what == kind and text in (value if kind == "line" else json.dumps(value))
    ]
    assert len(found) == 1, (text, items)
    return found[0]


def _errors(cell: Any) -> list[Any]:
    return [o for o in cell.outputs if o["output_type"] == "error"]


def _no_kernel_leak(cell: Any) -> None:
    text = json.dumps(cell.outputs)
    assert "attempted to send message from fork" not in text
    assert "<IPython.core.display" not in "".join(
        o.get("text", "") for o in cell.outputs if o["output_type"] == "stream"
    )


def _ranks(output: str) -> tuple[int, ...]:
    return (0,) if output == "main" else (0, 1)


def _check_kind(cell: Any, kind: str, output: str) -> None:
    """One launch's (or run's) cell: the kind's displays, each in order with its rank's lines
    (under ``"all"``, right under its rank's caption)."""
    assert not _errors(cell), _errors(cell)
    _no_kernel_leak(cell)
    items = _items(cell)
    mine: dict[int, list[int]] = {rank: [] for rank in _ranks(output)}
    for i, (what, value) in enumerate(items):
        if what != "display" or "notebook-accel-rank-mark" in _html(value):
            continue
        if output == "main":
            mine[0].append(i)
            continue
        caption = items[i - 1][1]
        assert caption in (_caption(0), _caption(1)), items  # every display has its rank's
        mine[int(caption["text/plain"][6])].append(i)
    for rank, indices in mine.items():
        before = _index(items, "line", f"[rank {rank}] before {kind}")
        after = _index(items, "line", f"[rank {rank}] after {kind}")
        assert indices and all(before < i < after for i in indices), (kind, rank, items)
        _check_content(kind, rank, [items[i][1] for i in indices])


def _caption(rank: int) -> dict[str, Any]:
    from notebook_accel.launch.show.rich import caption

    return caption(rank)


def _check_content(kind: str, rank: int, mine: list[dict[str, Any]]) -> None:
    texts = [_html(d) for d in mine]
    if kind == "html":
        assert texts == [f"<b>html from rank {rank}</b>"]
    elif kind == "update":  # updated in place: the first versions are gone
        assert texts == [f"<i>second {rank}</i>", f"<i>renamed {rank}</i>"]
    elif kind == "clear":  # one output, the last frame, where the first display was
        assert texts == [f"<i>frame 3 of {rank}</i>"]
    elif kind == "png":  # a base64 PNG, as a kernel sends it
        assert len(mine) == 1 and mine[0]["image/png"].startswith("iVBOR")
        assert mine[0]["text/plain"].startswith("<Figure")
    elif kind == "dataframe" and HAS_PANDAS:
        assert len(mine) == 1 and "<table" in texts[0] and "square" in texts[0]


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["launch", "run"])  # notebook_launcher, Workers.run
@pytest.mark.parametrize("output", ["main", "all"])
@pytest.mark.parametrize("kind", KINDS)
def test_what_a_rank_displays_shows_in_the_cell(
    forked: dict[str, Any], kind: str, output: str, where: str
) -> None:
    if kind == "dataframe" and not HAS_PANDAS:
        pytest.skip("needs pandas")
    _check_kind(forked[f"{where} {kind} {output}"], kind, output)


@pytest.mark.parametrize("kind", KINDS)
def test_the_fresh_forkserver_shows_the_same(fresh: dict[str, Any], kind: str) -> None:
    if kind == "dataframe" and not HAS_PANDAS:
        pytest.skip("needs pandas")
    _check_kind(fresh[f"launch {kind} all"], kind, "all")


@pytest.mark.parametrize("output", ["main", "all"])
def test_a_background_job_draws_its_displays_in_its_own_cell(
    forked: dict[str, Any], output: str
) -> None:
    submit = forked[f"submit {output}"]
    assert not _errors(submit), _errors(submit)
    displays = [o["data"] for o in submit.outputs if o["output_type"] == "display_data"]
    area = displays[3]  # made at submit, after the lines, bars and chart
    html = _html(area)
    for rank in _ranks(output):
        assert f"<b>html from rank {rank}</b>" in html
        assert f"<i>second {rank}</i>" in html and f"<i>renamed {rank}</i>" in html
        assert f"<i>frame 3 of {rank}</i>" in html
        for gone in (
            f">first {rank}<",
            f">named {rank}<",
            f">gone {rank}<",
            f">frame 2 of {rank}<",
        ):
            assert gone not in html
        if output == "all":
            assert _caption(rank)["text/html"] in html
    assert html.count("data:image/png;base64,iVBOR") == len(_ranks(output))
    if HAS_PANDAS:
        assert html.count("square") == len(_ranks(output))
    if output == "main":
        assert "rank-mark" not in html and " 1<" not in html
    # The job's second half ran while the next cell did; nothing of it landed there.
    meanwhile = forked[f"meanwhile {output}"]
    assert "meanwhile False" in json.dumps(meanwhile.outputs)
    assert {o["output_type"] for o in meanwhile.outputs} == {"stream"}
    assert "<i>" not in json.dumps(forked[f"result {output}"].outputs)


def test_debug_launcher_shows_what_a_rank_displays(forked: dict[str, Any]) -> None:
    _check_kind(forked["debug html all"], "html", "all")


def test_the_panel_shows_what_ranks_display(forked: dict[str, Any]) -> None:
    cell = forked["panel"]
    assert not _errors(cell), _errors(cell)
    [result] = [o for o in cell.outputs if o["output_type"] == "execute_result"]
    html = ast.literal_eval(result["data"]["text/plain"])
    expected = ""
    for rank in (0, 1):  # the panel shows every rank's, each under its caption
        expected += _caption(rank)["text/html"] + f"<i>second {rank}</i><i>renamed {rank}</i>"
    assert html == expected


def test_a_figure_as_a_distributed_cell_s_last_value(forked: dict[str, Any]) -> None:
    cell = forked["last value"]
    assert not _errors(cell), _errors(cell)
    pngs = [o for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 2  # each rank's, shown once (closed: no second flush)


def test_library_bars_draw_as_notebook_bars_and_widgets_are_refused(
    forked: dict[str, Any], fresh: dict[str, Any]
) -> None:
    for cells in (forked, fresh):
        cell = cells["libraries"]
        assert not _errors(cell), _errors(cell)
        _no_kernel_leak(cell)
        bars = [
            o["data"]["text/plain"]
            for o in cell.outputs
            if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
        ]
        # rank 0's bars only, drawn by the kernel (tqdm's notebook bar: a widget there)
        assert len(bars) == 2 and "auto bar" in bars[0] and "notebook bar" in bars[1], bars
        text = "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")
        refused = [line for line in text.splitlines() if "cannot be drawn from a rank" in line]
        assert sorted(line.split("]", 1)[0] for line in refused) == ["[rank 0", "[rank 1"]
        assert all("ipywidget (IntSlider)" in line for line in refused)
        # a library's logging, through the handler the notebook installed (a fork inherits
        # it, pointed at the rank's stderr; a fresh interpreter has logging's last resort)
        logged = "WARNING:a.library:" if cells is forked else ""
        for rank in (0, 1):
            assert f"[rank {rank}] {logged}a library's warning" in text.splitlines(), text
        if importlib.util.find_spec("rich") is not None:
            html = [_html(o["data"]) for o in cell.outputs if o["output_type"] == "display_data"]
            assert sum('font-weight: bold">rich text' in h for h in html) == 2, html


def test_a_launch_returning_only_none_shows_nothing(forked: dict[str, Any]) -> None:
    cell = forked["all none"]
    assert {o["output_type"] for o in cell.outputs} == {"stream"}  # the banner and lines
    assert "[rank 1] returns None" in json.dumps(cell.outputs)


def test_in_a_script_a_rank_s_display_prints_its_text() -> None:
    """No kernel: no display shell in the ranks; IPython prints what is displayed, as before."""
    code = (
        "from IPython.display import HTML, display\n"
        "from notebook_accel import notebook_launcher\n"
        "def shows():\n"
        "    display(HTML('<b>bold</b>'))\n"
        "notebook_launcher(shows, num_processes=2, hardware='cpu')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("[rank"))
    assert lines == [f"[rank {r}] <IPython.core.display.HTML object>" for r in (0, 1)]
