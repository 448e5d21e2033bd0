"""Worker-side progress bars that the parent draws.

    worker (rank r)                                   parent (notebook kernel)
    ---------------                                   ------------------------
    for x in tqdm(loader):      every `stride` steps:
        ...                       read the clock;     display.progress(r, Progress)
                                  every `interval`: ->  tqdm.notebook bar in the cell
                                  Progress(...) -->      (a text bar in a terminal)
    end / break / close()    --> Progress(closed=True)

A ``tqdm.notebook`` bar created inside a worker cannot work (its widget messages have no
kernel to go to), and a text bar arrives as ``\\r``-separated lines. So in a worker this
``tqdm`` draws nothing itself: it counts, and a few times a second it sends its state to the
parent. Outside a launch (no channel attached) it is exactly ``tqdm.auto.tqdm``.

The hot loop only increments a counter; the clock is read every ``stride`` iterations, with
``stride`` adapted so that the clock is read about 100 times per send interval, whatever the
speed of the loop. That keeps a 100,000-iteration loop within a few percent of a bare one.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from tqdm.auto import tqdm as _auto_tqdm

from .. import env
from ..private.tqdm import report_notebook_bars

if TYPE_CHECKING:
    from .channel import Sender

__all__ = ["tqdm", "trange", "attach", "detach", "channel", "adopt_library_bars"]

T = TypeVar("T")

# One channel per worker process: set by the worker entry point, read by the bars it creates.
_channel: Sender | None = None
_bar_ids = itertools.count()

_MIN_INTERVAL = 0.1  # seconds between two messages of one bar: at most ~10 updates/s
_CHECKS_PER_INTERVAL = 100  # clock reads aimed for per interval (cheap, keeps sends timely)
_MAX_STRIDE = 1 << 16
# Constructor options the parent's bar understands; the rest only make sense locally.
_FORWARDED = ("leave", "unit_scale", "unit_divisor", "bar_format", "colour", "ascii")


def attach(sender: Sender) -> None:
    """Make bars created from now on in this process report through ``sender``.

    Called by the worker entry point; users never need it.
    """
    global _channel
    _channel = sender


def detach() -> None:
    """Stop reporting: bars created afterwards behave like ``tqdm.auto.tqdm``."""
    global _channel
    _channel = None


def adopt_library_bars() -> None:
    """In a rank that reports to a notebook: the bars libraries make report as ours do.

    ``tqdm.auto``'s (and ``tqdm.autonotebook``'s) ``tqdm`` and ``trange`` become this
    module's, for what imports them from now on (a fresh interpreter chose tqdm's text bar);
    ``tqdm.notebook``'s bar, which the kernel chose and libraries imported there subclassed
    (datasets), reports its state instead of building widgets (private/tqdm.py). Only rank
    0's are sent, as for this module's bars.
    """
    for name in ("tqdm.autonotebook", "tqdm.auto"):
        module = sys.modules.get(name)
        if module is not None:
            module.tqdm = tqdm  # type: ignore[attr-defined]
            module.trange = trange  # type: ignore[attr-defined]
    report_notebook_bars(_report_notebook_bar)


def _report_notebook_bar(bar: Any, closed: bool) -> None:
    """A ``tqdm.notebook`` bar's state, as a Progress message of rank 0 (once closed: never
    again: its end redraws twice after an exception)."""
    sender = _channel
    state = bar.__dict__
    if sender is None or state.get("_notebook_accel_closed") or env.read_distributed().rank:
        return
    from .channel import Progress

    if "_notebook_accel_bar" not in state:
        state["_notebook_accel_bar"] = next(_bar_ids)
    state["_notebook_accel_closed"] = closed
    options = tuple(
        (key, getattr(bar, key)) for key in ("leave", "unit_scale", "unit_divisor") if key in state
    )
    sender.send(
        Progress(
            bar=state["_notebook_accel_bar"],
            n=bar.n,
            total=bar.total,
            desc=str(bar.desc or ""),
            unit=str(bar.unit or "it"),
            closed=closed,
            options=(*options, ("postfix", str(bar.postfix or ""))),
        )
    )


def channel() -> Sender | None:
    """The sender to the parent, or ``None`` outside a launch.

    Example:
        >>> channel() is None  # in the notebook itself
        True
    """
    return _channel


class tqdm(_auto_tqdm):  # noqa: N801  (tqdm's own name)
    """``tqdm`` that, inside a launched worker, reports to the bar the parent draws.

    Takes tqdm's arguments (``iterable``, ``desc``, ``total``, ``leave``, ``unit``,
    ``unit_scale``, ``disable``, ``initial``, ``postfix``, ``mininterval``, ...) and its
    methods (``update``, ``close``, ``set_description``, ``set_postfix``, ``reset``, ``write``,
    use as a context manager). In a worker only rank 0's bar is shown unless
    ``all_ranks=True``, which shows one bar per rank. Outside a launch it is
    ``tqdm.auto.tqdm`` (a notebook widget in Jupyter, text in a terminal).

    Args:
        iterable: what to iterate over (optional with manual ``update()``).
        *args: tqdm's positional arguments (``desc``, ``total``, ...).
        all_ranks: in a launch, draw a bar for every rank, not only rank 0.
        main_process_only: accelerate's spelling: ``False`` is ``all_ranks=True``.
        **kwargs: tqdm's keyword arguments.

    Example:
        >>> from notebook_accel import tqdm
        >>> total = 0
        >>> for i in tqdm(range(3), desc="demo", disable=True):
        ...     total += i
        >>> total
        3
    """

    n: float
    total: float | None

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *args: Any,
        all_ranks: bool = False,
        main_process_only: bool = True,
        **kwargs: Any,
    ) -> None:
        all_ranks = all_ranks or not main_process_only
        sender = _channel
        self._sender: Sender | None = None
        if sender is None:
            super().__init__(iterable, *args, **kwargs)
            return
        options = _named(args, kwargs)
        total = options.get("total")
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except (TypeError, AttributeError):
                total = None
        initial = options.get("initial", 0) or 0
        # Nothing is drawn here; tqdm's disabled mode gives the attributes users read.
        super().__init__(
            iterable, total=total, initial=initial, disable=True, leave=options.get("leave", True)
        )
        self.desc = str(options.get("desc") or "")
        self.unit = str(options.get("unit") or "it")
        self.postfix = _postfix_text(options.get("postfix"))
        if options.get("disable") is True or not (all_ranks or env.read_distributed().rank == 0):
            return  # counts like a bar, sends nothing
        self._sender = sender
        self._bar = next(_bar_ids)
        self._interval = max(_MIN_INTERVAL, float(options.get("mininterval") or 0.0))
        self._forward = tuple((k, options[k]) for k in _FORWARDED if k in options)
        if all_ranks:
            self._forward += (("all_ranks", True),)
        self._stride = 1
        self._next_check = self.n + 1
        self._last_check = time.perf_counter()
        self._send()

    # -- reporting --------------------------------------------------------------------------
    def _send(self, closed: bool = False) -> None:
        from .channel import Progress

        assert self._sender is not None
        self._sender.send(
            Progress(
                bar=self._bar,
                n=self.n,
                total=self.total,
                desc=self.desc,
                unit=self.unit,
                closed=closed,
                options=self._forward + (("postfix", self.postfix),),
            )
        )
        self._due = time.perf_counter() + self._interval

    def _tick(self) -> None:
        """Called every ``stride`` steps: send if due, and adapt the stride to the loop."""
        now = time.perf_counter()
        if now >= self._due:
            self._send()
        # Aim for _CHECKS_PER_INTERVAL clock reads per interval: a loop that speeds up or
        # slows down (a first slow batch, then fast ones) keeps its updates timely.
        gap = now - self._last_check
        target = self._interval / _CHECKS_PER_INTERVAL
        if gap < target / 2 and self._stride < _MAX_STRIDE:
            self._stride *= 2
        elif gap > target * 2 and self._stride > 1:
            self._stride //= 2
        self._last_check = now
        self._next_check = self.n + self._stride

    # -- tqdm's interface -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._sender is None:
            yield from super().__iter__()
            return
        n = self.n
        check = self._next_check
        try:
            for item in self.iterable:
                yield item
                n += 1
                if n >= check:
                    self.n = n
                    self._tick()
                    check = self._next_check
        finally:
            self.n = n
            self.close()

    def update(self, n: float | None = 1) -> bool | None:
        """Advance by ``n`` (tqdm's ``update``); reports when due."""
        if self._sender is None:
            return super().update(n)
        self.n += 1 if n is None else n
        if self.n >= self._next_check:
            self._tick()
        return True

    def close(self) -> None:
        """End the bar; in a worker the parent's bar shows the final count."""
        sender, self._sender = self._sender, None
        if sender is None:
            super().close()
            return
        self._sender = sender
        self._send(closed=True)
        self._sender = None

    def refresh(self, *args: Any, **kwargs: Any) -> None:
        """Redraw now (in a worker: send the state now)."""
        if self._sender is None:
            super().refresh(*args, **kwargs)
        else:
            self._send()

    def reset(self, total: float | None = None) -> None:
        """Start again from 0, with a new ``total`` if given."""
        if self._sender is None:
            super().reset(total=total)
            return
        self.n = 0
        if total is not None:
            self.total = total
        self._next_check = 1
        self._send()

    def set_description(self, desc: str | None = None, refresh: bool | None = True) -> None:
        """Change the bar's label (sent with the next update)."""
        if self._sender is None:
            super().set_description(desc, refresh=refresh)
        else:
            self.desc = f"{desc}: " if desc else ""

    def set_description_str(self, desc: str | None = None, refresh: bool | None = True) -> None:
        """Change the bar's label without the ``": "`` suffix."""
        if self._sender is None:
            super().set_description_str(desc, refresh=refresh)
        else:
            self.desc = desc or ""

    def set_postfix(
        self,
        ordered_dict: Mapping[str, Any] | None = None,
        refresh: bool | None = True,
        **kwargs: Any,
    ) -> None:
        """Show values after the bar, e.g. ``bar.set_postfix(loss=0.25)``."""
        if self._sender is None:
            super().set_postfix(ordered_dict, refresh=refresh, **kwargs)
        else:
            self.postfix = _postfix_text({**(ordered_dict or {}), **kwargs})

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """Show a string after the bar."""
        if self._sender is None:
            super().set_postfix_str(s, refresh=refresh)
        else:
            self.postfix = str(s)


def trange(*args: int, **kwargs: Any) -> tqdm:
    """``tqdm(range(*args), **kwargs)``.

    Example:
        >>> sum(trange(4, disable=True))
        6
    """
    return tqdm(range(*args), **kwargs)


_POSITIONAL = (
    "desc",
    "total",
    "leave",
    "file",
    "ncols",
    "mininterval",
    "maxinterval",
    "miniters",
    "ascii",
    "disable",
    "unit",
    "unit_scale",
    "dynamic_ncols",
    "smoothing",
    "bar_format",
    "initial",
    "position",
    "postfix",
    "unit_divisor",
)


def _named(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """tqdm's positional arguments (after ``iterable``) by name, merged with ``kwargs``."""
    if len(args) > len(_POSITIONAL):
        raise TypeError(f"tqdm() takes at most {len(_POSITIONAL) + 1} positional arguments")
    return {**dict(zip(_POSITIONAL, args, strict=False)), **kwargs}


def _postfix_text(postfix: Any) -> str:
    """tqdm's postfix format: ``key=value`` pairs, numbers shortened."""
    if postfix is None:
        return ""
    if not isinstance(postfix, Mapping):
        return str(postfix)
    parts = []
    for key, value in postfix.items():
        if isinstance(value, float):
            value = _auto_tqdm.format_num(value)
        parts.append(f"{key}={str(value).strip()}")
    return ", ".join(parts)
