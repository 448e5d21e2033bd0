"""LaunchPanel: pick hardware, processes and precision in the notebook, launch, watch, stop.

    controls (hardware, processes, precision,    --> LaunchConfig (validated)
              accumulation steps, seed)              --> config file, only with "Save as default"
    Launch  --> background thread: launch(function, args, config, display=_PanelDisplay,
                                          stop=event)
                  banner / lines / progress  -->  rank rows, log, bars in the panel
                  Accelerator.log rows       -->  the live chart (launch/show/charts.py), .metrics
                  what the ranks display     -->  the panel's displays area (show/rich.py)
                  each rank's health (~1/s)  -->  memory and steps/s in its row; quiet: flagged
                  results or exception       -->  panel.results / panel.error, shown plainly
    Stop    --> event.set(): the launcher stops every worker as for a KeyboardInterrupt

With ``workers=`` (a session, launch/local/session.py) the form shows the session's choices, fixed,
and Launch becomes Run: ``Workers.call(function, args, display=_PanelDisplay, stop=event)``
on the session's workers (which keep their namespace); Stop interrupts the run, and the
session stays usable when every rank comes back.

The panel holds no launch logic: validation is LaunchConfig's and the launch's plan's
(launch/plan.py, options/rules.py), the launch is ``notebook_accel.launch.launch``. The launch
runs in a thread so that the kernel keeps serving widget messages (the Stop button) while the
workers run.
"""

from __future__ import annotations

import html
import importlib.util
import json
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ipywidgets as w

from .. import hardware
from ..config import LaunchConfig, load_file, options, save_file
from ..errors import ConfigError, NotebookAccelError, user_text
from ..launch.local.session import Workers
from ..launch.plan import plan_for
from ..launch.show import charts, rich
from ..launch.show.display import Bar, Display, Sink, meter
from ..reporting.channel import Health, Progress

__all__ = ["LaunchPanel"]

# The form's order of the controls this panel draws itself; an option of the table whose
# ``panel`` names another control gets a plain one (_plain_control), after these.
_ORDER = ("hardware", "processes", "precision", "accumulation", "sharding", "compile", "seed")
# torch.compile backends offered (the launcher takes any of accelerate's names).
_COMPILE = (
    ("No (eager)", "no"),
    ("torch.compile: inductor", "inductor"),
    ("torch.compile: aot_eager", "aot_eager"),
    ("torch.compile: eager (debug)", "eager"),
)
_LOG_LINES = 400  # the panel keeps the last lines of output; the rest scrolls away
_QUIET = 5.0  # seconds without a health report after which a running rank is flagged


class LaunchPanel(w.VBox):
    """A launch form for ``function``, shown as a cell's output.

    Its controls (``hardware``, ``processes``, ``precision``, ``accumulation``, ``sharding``,
    ``compile``, ``seed``)
    offer only what this machine has; ``launch_button`` runs
    ``notebook_launcher``'s launch with them, ``stop_button`` stops every worker. The panel
    starts from the config file's choices; it writes them back (as the defaults that
    ``notebook_launcher`` and the command line read) only when ``save_default`` is ticked.

    Args:
        function: the function to run in every worker.
        args: its positional arguments.
        kwargs: its keyword arguments.
        machine: the hardware to offer (default: this machine, detected).
        workers: run on this session's workers instead of launching (the button says Run).
        table: the launch options (LaunchConfig; a subclass adding some): each option whose
            ``panel`` names a control is shown by it.

    Example:
        >>> panel = LaunchPanel(train, args=(3e-4,))  # doctest: +SKIP
        >>> panel  # the form in the cell                # doctest: +SKIP
        >>> panel.processes.value = 2; panel.launch_button.click()  # doctest: +SKIP
        >>> panel.wait(); panel.results                   # doctest: +SKIP
        [0.91, 0.91]
    """

    def __init__(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        machine: hardware.Machine | None = None,
        workers: Workers | None = None,
        table: type[LaunchConfig] = LaunchConfig,
    ) -> None:
        self.function = function
        self.workers = workers
        self.args = args
        self.kwargs = kwargs
        self.machine = machine or hardware.detect()
        self.results: list[Any] | None = None
        self.error: BaseException | None = None
        self._kinds = {k.name: k for k in hardware.kinds(self.machine)}
        self._cluster = _ray_cluster()  # (description, CPUs, GPUs) of a joined Ray cluster
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.table = table
        saved, problem = _saved_choices(table)
        self._build_controls()
        self._controls = self._made_controls()
        self._show(saved)
        self.status = w.HTML()
        self.ranks = w.VBox()
        self.bars = w.VBox()
        # [metrics] the live chart of Accelerator.log (shown once rows arrive)
        self.chart = w.Image(format="png", layout=w.Layout(display="none", max_width="100%"))
        self.chart.add_class("notebook-accel-chart")
        self.chart_line = w.HTML()
        # what the ranks display (show/rich.py), each under its rank's caption, as HTML (images
        # inline): an Output widget would be drawn whole, but Colab's widget protocol in the
        # classic page (widgetsnbextension 3.6) cannot create one, nor the panel around it
        self.displays = w.HTML()
        self.displays.add_class("notebook-accel-displays")
        self._display: _PanelDisplay | None = None
        self.output_area = w.HTML()
        self.outcome = w.HTML()
        self.launch_button.on_click(lambda _: self.launch())
        self.stop_button.on_click(lambda _: self.stop())
        self.hardware.observe(lambda _: self._hardware_changed(), names="value")
        form = w.VBox([*self._choices(), w.HBox([self.launch_button, self.stop_button])])
        super().__init__(
            [
                form,
                self.status,
                self.ranks,
                self.bars,
                self.chart,
                self.chart_line,
                self.displays,
                self.output_area,
                self.outcome,
            ]
        )
        self.add_class("notebook-accel-panel")
        self._say(problem or "Ready.", warn=bool(problem))
        if workers is not None:
            self._for_session(workers)

    def _for_session(self, workers: Workers) -> None:
        """The session decided the choices: show them, fixed; Launch becomes Run."""
        self.processes.max = max(self.processes.max, workers.num_processes)
        self._show({**workers.config.plain(), "num_processes": workers.num_processes})
        self.launch_button.description = "Run"
        self._set_running(False)
        self._say(f"Runs on the session's workers: {workers.plan.describe()}.")

    # -- controls ---------------------------------------------------------------------------
    def _build_controls(self) -> None:
        style = {"description_width": "150px"}
        # Wide enough for the longest choice after the 150px label ("DDP (a full copy per
        # process)" was cut at the default 300px in JupyterLab).
        wide = w.Layout(width="460px")
        self.hardware = w.Dropdown(
            description="Hardware",
            style=style,
            layout=wide,
            options=[(k.describe(self.machine), k.name) for k in self._kinds.values()]
            + ([(self._cluster[0], _RAY)] if self._cluster else []),
        )
        self.processes = w.BoundedIntText(description="Processes", min=1, value=1, style=style)
        self.precision = w.Dropdown(description="Mixed precision", style=style, layout=wide)
        self.accumulation = w.BoundedIntText(
            description="Accumulation steps", min=1, max=1 << 16, value=1, style=style
        )
        self.sharding = w.Dropdown(
            description="Model sharding",
            style=style,
            layout=wide,
            options=[
                ("DDP (a full copy per process)", "no"),
                ("FSDP full shard", "full"),
                ("FSDP shard grads/optimizer", "grad_op"),
                # DeepSpeed is an optional extra: offered where it is installed.
                *(
                    [("DeepSpeed ZeRO-2", "zero2"), ("DeepSpeed ZeRO-3", "zero3")]
                    if importlib.util.find_spec("deepspeed") is not None
                    else []
                ),
            ],
        )
        self.compile = w.Dropdown(
            description="Compile", style=style, layout=wide, options=list(_COMPILE), value="no"
        )
        self.seed = w.Text(description="Seed", placeholder="none", style=style)
        # Saving is opt-in: a launch to try something must not change later launches' defaults.
        self.save_default = w.Checkbox(
            description="Save as default for later launches", value=False, indent=False
        )
        self.launch_button = w.Button(description="Launch", button_style="success", icon="play")
        self.stop_button = w.Button(
            description="Stop", button_style="danger", icon="stop", disabled=True
        )
        self._hardware_changed()

    def _hardware_changed(self) -> None:
        """Bound the processes and offer the precisions of the chosen hardware."""
        if self.hardware.value == _RAY and self._cluster:
            _, cpus, gpus = self._cluster  # one rank per GPU, else per CPU, of the cluster
            bound = max(1, gpus or cpus)
            self.processes.max = bound
            self.processes.value = min(bound if gpus else 2, bound)
            precisions: tuple[str, ...] = ("no", "fp16", "bf16") if gpus else ("no", "bf16")
            current = self.precision.value
            self.precision.options = list(precisions)
            self.precision.value = current if current in precisions else "no"
            return
        kind = self._kinds[self.hardware.value]
        bound = kind.count(self.machine) or self.machine.cpu_cores
        self.processes.max = bound
        self.processes.value = min(kind.default_processes(self.machine), bound)
        precisions = kind.precisions(self.machine)
        current = self.precision.value
        self.precision.options = list(precisions)
        self.precision.value = current if current in precisions else "no"

    def _made_controls(self) -> dict[str, _Control]:
        """The form's controls, from the table: each option's ``panel`` names its control."""
        wanted: dict[str, list[str]] = {}
        for name, spec in options(self.table).items():
            if spec.panel is not None:
                wanted.setdefault(spec.panel, []).append(name)
        own = {
            "hardware": _Control(self.hardware, self._read_hardware, self._show_hardware),
            "processes": _field_control(self.processes, "num_processes"),
            "precision": _Control(self.precision, self._read_precision, self._show_precision),
            "accumulation": _field_control(self.accumulation, "gradient_accumulation_steps"),
            "sharding": _Control(self.sharding, self._read_sharding, self._show_sharding),
            "compile": _Control(self.compile, self._read_compile, self._show_compile),
            "seed": _Control(self.seed, self._read_seed, self._show_seed),
        }
        made = {name: own[name] for name in _ORDER if name in wanted}
        for name, names in wanted.items():
            if name not in made:
                made[name] = _plain_control(name, names, self.table)
        return made

    def _show(self, values: dict[str, Any]) -> None:
        """Show ``values`` (the config file's, a session's), where this machine can honour
        them."""
        for control in self._controls.values():
            control.show(values)

    def _read_hardware(self) -> dict[str, Any]:
        return {"hardware": "auto" if self.hardware.value == _RAY else self.hardware.value}

    def _show_hardware(self, values: dict[str, Any]) -> None:
        if values.get("hardware") in self._kinds:
            self.hardware.value = values["hardware"]

    def _read_precision(self) -> dict[str, Any]:
        return {"mixed_precision": self.precision.value}

    def _show_precision(self, values: dict[str, Any]) -> None:
        if values.get("mixed_precision") in self.precision.options:
            self.precision.value = values["mixed_precision"]

    def _read_sharding(self) -> dict[str, Any]:
        choice = self.sharding.value
        zero = choice.startswith("zero")
        return {
            "fsdp": None if choice == "no" or zero else choice,
            "deepspeed": int(choice[-1]) if zero else None,
        }

    def _show_sharding(self, values: dict[str, Any]) -> None:
        strategy = (values.get("fsdp") or {}).get("sharding_strategy", "no")
        if values.get("deepspeed") is not None:
            strategy = f"zero{values['deepspeed'].get('zero_stage', 2)}"
        if strategy in dict(self.sharding.options).values():
            self.sharding.value = strategy

    def _read_compile(self) -> dict[str, Any]:
        return {"dynamo_backend": self.compile.value}

    def _show_compile(self, values: dict[str, Any]) -> None:
        if values.get("dynamo_backend") in dict(self.compile.options).values():
            self.compile.value = values["dynamo_backend"]

    def _read_seed(self) -> dict[str, Any]:
        text = self.seed.value.strip()
        try:
            return {"seed": None if text in ("", "none", "None") else int(text)}
        except ValueError:
            raise ConfigError("seed", text, "an int >= 0, or empty for none") from None

    def _show_seed(self, values: dict[str, Any]) -> None:
        if "seed" in values:
            self.seed.value = "" if values["seed"] is None else str(values["seed"])

    @property
    def launch_config(self) -> LaunchConfig:
        """The launch configuration the controls describe (raises ConfigError if invalid)."""
        chosen: dict[str, Any] = {}
        for control in self._controls.values():
            chosen.update(control.read())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a broken file was reported when the panel opened
            base = self.table.from_defaults()
        if self.hardware.value == _RAY and self._cluster:
            gpu = {"GPU": 1} if self._cluster[2] else None
            base = base.replace(cluster="ray", resources_per_worker=gpu, num_nodes=1)
        # The panel's own controls decide these, whatever the file said.
        return base.replace(from_file=tuple(k for k in base.from_file if k not in chosen), **chosen)

    # -- launching --------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether a launch is in progress."""
        return self._thread is not None and self._thread.is_alive()

    def launch(self) -> None:
        """What the Launch button does: validate, save if asked, start in the background."""
        if self.running:
            return
        if self.workers is not None:
            self._start(None, self.workers.num_processes, "Running...")
            return
        try:
            config = self.launch_config
            if config.cluster is None:  # bad choices are reported before starting
                plan_for(config, self.machine)  # the launch's own checks (options/rules.py)
        except ConfigError as exc:
            self._say(str(exc), warn=True)
            return
        note = ""
        if self.save_default.value:
            try:
                note = f" (saved as the default in {save_file(config)})"
            except OSError as exc:
                note = f" (the choices could not be saved: {exc})"
        self._start(config, config.num_processes or 1, "Starting..." + note)

    def _start(self, config: LaunchConfig | None, processes: int, status: str) -> None:
        self.results, self.error = None, None
        self._stop.clear()
        self.outcome.value = ""
        self.bars.children = ()
        self.chart.layout.display = "none"
        self.chart_line.value = ""
        self.displays.value = ""
        display = _PanelDisplay(self, processes)
        self._display = display
        self._set_running(True)
        self._say(status)
        self._thread = threading.Thread(
            target=self._run, args=(config, display), name="notebook-accel-panel", daemon=True
        )
        self._thread.start()

    def _run(self, config: LaunchConfig | None, display: _PanelDisplay) -> None:
        from ..launch import launch

        started = time.monotonic()
        try:
            if config is None:
                assert self.workers is not None
                self.results = self.workers.call(
                    self.function, self.args, self.kwargs, display=display, stop=self._stop
                )
            else:
                self.results = launch(
                    self.function, self.args, self.kwargs, config, display=display, stop=self._stop
                )
        except BaseException as exc:  # noqa: BLE001  (shown in the panel: the thread's end)
            self.error = exc
        finally:
            display.finish(self.results is not None, self.error)
            self._show_outcome(time.monotonic() - started)
            self._set_running(False)

    def stop(self) -> None:
        """What the Stop button does: stop every worker, as an interrupt would."""
        if self.running:
            self._stop.set()
            self._say("Stopping...")

    @property
    def metrics(self) -> list[dict[str, float]]:
        """The rows ``Accelerator.log`` sent during the last launch (plain dicts).

        Example:
            >>> panel.metrics[-1]  # doctest: +SKIP
            {'step': 99, 'loss': 0.12}
        """
        if self._display is None:
            return []
        return [dict(row) for row in self._display.metric_rows]

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the launch ends; ``True`` if it ended (for code driving the panel)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    # -- showing ----------------------------------------------------------------------------
    def _choices(self) -> tuple[w.DOMWidget, ...]:
        """The form's choices, top to bottom."""
        return (*(control.widget for control in self._controls.values()), self.save_default)

    def _set_running(self, running: bool) -> None:
        fixed = self.workers is not None  # a session's choices were made when it started
        for control in self._choices():
            control.disabled = running or fixed
        self.launch_button.disabled = running
        self.stop_button.disabled = not running

    def _say(self, text: str, warn: bool = False) -> None:
        color = "#b00020" if warn else "inherit"
        self.status.value = f'<span style="color:{color}">{html.escape(text)}</span>'

    def _show_outcome(self, seconds: float) -> None:
        if self.error is None:
            self._say(f"Finished in {seconds:.1f} s.")
            self.outcome.value = (
                '<div class="notebook-accel-results"><b>Results</b> (one per rank): '
                f"<code>{html.escape(repr(self.results))}</code></div>"
            )
            return
        exc = self.error
        if isinstance(exc, KeyboardInterrupt):
            if self.workers is not None and not self.workers.closed:
                self._say("Stopped: every rank came back; the session is still usable.", warn=True)
            else:
                self._say("Stopped: every worker was ended.", warn=True)
            return
        self._say(f"Failed after {seconds:.1f} s.", warn=True)
        remote = exc.__cause__
        detail = str(remote) if remote is not None else user_text(exc)
        self.outcome.value = (
            '<div class="notebook-accel-error"><b>Error</b>: '
            f"<code>{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</code>"
            f"<details><summary>traceback</summary><pre>{html.escape(detail)}</pre></details>"
            "</div>"
        )


@dataclass(frozen=True)
class _Control:
    """One row of the form: its widget, the options it decides (``read``), and how it shows
    values as the config file holds them (``show``: the keys it knows, where it can)."""

    widget: w.DOMWidget
    read: Callable[[], dict[str, Any]]
    show: Callable[[dict[str, Any]], None]


def _field_control(widget: w.DOMWidget, name: str) -> _Control:
    """A number box that decides option ``name`` alone."""

    def show(values: dict[str, Any]) -> None:
        value = values.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            widget.value = min(value, widget.max)

    return _Control(widget, lambda: {name: widget.value}, show)


def _plain_control(label: str, names: list[str], table: type[LaunchConfig]) -> _Control:
    """The control of an option the panel has no drawing of its own for: a dropdown of its
    choices, else a text box whose text is read as JSON (a number, ``null``), else as text;
    empty leaves the option to the config file. The option's own check judges the value."""
    [name] = names  # a plain control decides one option
    spec = options(table)[name]
    style = {"description_width": "150px"}
    if spec.choices:
        widget: w.DOMWidget = w.Dropdown(description=label, options=list(spec.choices), style=style)

        def read() -> dict[str, Any]:
            return {name: widget.value}
    else:
        widget = w.Text(description=label, placeholder="default", style=style)

        def read() -> dict[str, Any]:
            text = widget.value.strip()
            if not text:
                return {}
            try:
                return {name: json.loads(text)}
            except ValueError:
                return {name: text}

    def show(values: dict[str, Any]) -> None:
        if name not in values:
            return
        value = values[name]
        if spec.choices:
            if value in spec.choices:
                widget.value = value
        else:
            widget.value = "" if value is None else json.dumps(value)

    return _Control(widget, read, show)


class _PanelDisplay(Display):
    """The launcher's display, drawn into the panel instead of the cell."""

    def __init__(self, panel: LaunchPanel, num_processes: int) -> None:
        super().__init__(output="all")
        self.panel = panel
        self.lines: deque[str] = deque(maxlen=_LOG_LINES)
        self.state = {rank: "starting" for rank in range(num_processes)}
        self.last = dict.fromkeys(range(num_processes), "")
        self.ended: dict[int, set[str]] = {rank: set() for rank in range(num_processes)}
        self.stdout = self.stderr = Sink(self.add_lines, self.flush)  # type: ignore[assignment]
        self._rows = [w.HTML() for _ in range(num_processes)]
        self.vitals: dict[int, str] = {}  # rank -> "512 MiB RSS · 35.1 steps/s"
        self._heard: dict[int, tuple[float, Health]] = {}  # rank -> (seen at, last report)
        self.quiet: set[int] = set()
        self.widget_bars: list[_WidgetBar] = []
        panel.ranks.children = tuple(self._rows)
        self.panel.output_area.value = ""
        self.draw_ranks()

    def banner(self, text: str) -> None:
        self.panel._say(text)
        for rank, state in self.state.items():
            if state == "starting":
                self.state[rank] = "running"
        self.draw_ranks()

    def rank_state(self, rank: int, state: str) -> None:
        if rank in self.state:
            self.state[rank] = state
            self.draw_ranks()

    def end(self, rank: int, stream: str) -> None:
        super().end(rank, stream)
        self.ended.setdefault(rank, set()).add(stream)
        if self.ended[rank] >= {"stdout", "stderr"} and self.state.get(rank) == "running":
            self.state[rank] = "exited"
            self.draw_ranks()

    def open_bar(self, rank: int, prefix: str, message: Progress, options: dict[str, Any]) -> Bar:
        bar = _WidgetBar(prefix, message)
        self.widget_bars.append(bar)
        self.panel.bars.children = (*self.panel.bars.children, bar.box)
        return bar

    def draw_displays(self, changed: list[tuple[rich.Slot, bool]]) -> None:
        """What the ranks display, drawn whole into the panel's displays area."""
        if changed and self.areas is not None:
            self.panel.displays.value = rich.merged(self.areas, marked=True).get("text/html", "")

    # -- [metrics] chart and health --------------------------------------------------------
    def open_chart(self) -> charts.ChartView:
        return _WidgetChart(self.panel)

    def health(self, rank: int, message: Health) -> None:
        now = time.monotonic()
        previous = self._heard.get(rank)
        self._heard[rank] = (now, message)
        self.quiet.discard(rank)
        parts = [f"{message.rss / 2**20:.0f} MiB RSS"]
        if message.gpu is not None:
            parts.append(f"{message.gpu / 2**30:.2f} GiB GPU")
        if message.steps is not None and previous is not None and previous[1].steps is not None:
            seconds = message.time - previous[1].time
            if seconds > 0:
                parts.append(f"{(message.steps - previous[1].steps) / seconds:.1f} steps/s")
        self.vitals[rank] = " · ".join(parts)
        self.draw_ranks()

    def tick(self) -> None:
        """Flag a running rank that has not reported for a while (stuck, stopped, swapping)."""
        super().tick()
        now = time.monotonic()
        quiet = {
            rank
            for rank, (seen, _) in self._heard.items()
            if self.state.get(rank) == "running" and now - seen > _QUIET
        }
        if quiet != self.quiet:
            self.quiet = quiet
            self.draw_ranks()

    def finish(self, ok: bool, error: BaseException | None) -> None:
        """The launch ended: every rank finished, or which one failed and who was stopped."""
        failed = getattr(error, "rank", None)
        for rank in self.state:
            if ok:
                self.state[rank] = "finished"
            elif rank == failed:
                self.state[rank] = "failed"
            else:
                self.state[rank] = (
                    "stopped"
                    if isinstance(error, KeyboardInterrupt) or (failed is not None)
                    else "failed"
                )
        self.quiet.clear()
        # Bars that did not reach their end: red where the launch failed, amber if stopped.
        ending = "warning" if isinstance(error, KeyboardInterrupt) else "danger"
        for bar in self.widget_bars:
            if not ok:
                bar.interrupt(ending)
        self.draw_ranks()

    def add_lines(self, text: str) -> None:
        for line in text.splitlines():
            self.lines.append(line)
            if line.startswith("[rank "):
                head, _, rest = line.partition("] ")
                rank = int(head[6:]) if head[6:].isdigit() else -1
                if rank in self.last:
                    self.last[rank] = rest

    def flush(self) -> None:
        self.panel.output_area.value = (
            '<pre class="notebook-accel-log" style="max-height:16em;overflow:auto">'
            + html.escape("\n".join(self.lines))
            + "</pre>"
        )
        self.draw_ranks()

    def draw_ranks(self) -> None:
        colors = {"failed": "#b00020", "finished": "#1b7f3b", "stopped": "#a05a00"}
        for rank, row in enumerate(self._rows):
            state = self.state[rank]
            vitals = self.vitals.get(rank, "")
            if rank in self.quiet:
                seen = time.monotonic() - self._heard[rank][0]
                vitals = (
                    f'<b class="notebook-accel-quiet" style="color:#b00020">not reporting for '
                    f"{seen:.0f} s</b> (last: {vitals})"
                )
            vitals = f' <span class="notebook-accel-vitals">[{vitals}]</span>' if vitals else ""
            row.value = (
                f'<span class="notebook-accel-rank">rank {rank}: '
                f'<b style="color:{colors.get(state, "inherit")}">{state}</b>{vitals}'
                f" <code>{html.escape(self.last[rank][-120:])}</code></span>"
            )


class _WidgetBar:
    """A worker's progress bar as widgets: a progress bar and tqdm's text next to it."""

    def __init__(self, prefix: str, message: Progress) -> None:
        self.prefix = prefix
        self.started = time.monotonic()
        self.progress = w.FloatProgress(min=0.0, max=1.0, value=0.0)
        self.text = w.HTML()
        self.box = w.HBox([self.progress, self.text])
        self.done = False

    def show(self, message: Progress, postfix: str) -> None:
        total = message.total
        self.progress.value = min(1.0, message.n / total) if total else 0.0
        self.text.value = html.escape(meter(self.prefix, message, self.started, postfix))
        if message.closed:
            self.done = True
            self.progress.bar_style = "success"

    def interrupt(self, style: str) -> None:
        """The launch ended before this bar did: colour it (``"danger"``/``"warning"``)."""
        if not self.done:
            self.done = True
            self.progress.bar_style = style
            word = "stopped" if style == "warning" else "failed"
            self.text.value += f" <b>({word})</b>"

    def close(self) -> None:
        """Nothing to release: the bar stays in the panel, showing its last state."""


_RAY = "ray"  # the hardware dropdown's value for the Ray cluster


def _ray_cluster() -> tuple[str, int, int] | None:
    """A Ray cluster this kernel joined (``ray.init``): its description, CPUs and GPUs."""
    ray = sys.modules.get("ray")  # never imported here: a joined cluster imported it already
    try:
        if ray is None or not ray.is_initialized():
            return None
        from ..launch.cluster.ray.driver import describe_cluster

        total = ray.cluster_resources()
        return describe_cluster(ray), int(total.get("CPU", 0)), int(total.get("GPU", 0))
    except Exception:  # an unreachable cluster is not offered
        return None


class _WidgetChart:
    """The live chart in the panel: an ``ipywidgets.Image`` (or a text line without matplotlib)."""

    interval = 0.5

    def __init__(self, panel: LaunchPanel) -> None:
        self.panel = panel
        self._renderer = charts.Renderer() if charts.charts_available() else None

    def draw(self, board: charts.Board, final: bool) -> None:
        if self._renderer is None:
            self.panel.chart_line.value = f"<code>{html.escape(board.line())}</code>"
            return
        self.panel.chart.value = self._renderer.png(board)
        self.panel.chart.layout.display = ""
        self.panel.chart_line.value = (
            f'<code class="notebook-accel-metrics">{html.escape(board.line())}</code>'
        )

    def move_down(self) -> bool:
        return False  # the panel's chart has its own place, under the bars


def _saved_choices(table: type[LaunchConfig]) -> tuple[dict[str, Any], str]:
    """The config file's values, and a plain message if it could not be used."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            values = load_file(None, table)
        except (OSError, ValueError, NotebookAccelError) as exc:
            return {}, f"The config file could not be read ({exc}); using the defaults."
    problem = " ".join(str(c.message) for c in caught)
    return values, problem
