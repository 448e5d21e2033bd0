"""``%%distributed``: a notebook cell run on a session's workers, in their namespace.

%load_ext notebook_accel           -> load_ipython_extension: the magic is registered
%%distributed [NAME] [--ranks R] [--timeout S]
<plain Python>                     -> Workers.run_cell(cell, ranks, timeout) on the session
                                      NAME names in the notebook, else the latest opened
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..errors import ConfigError, UserFrames
from ..launch.local.session import Workers, latest

__all__ = ["DistributedMagics", "load_ipython_extension", "parse_ranks"]


def parse_ranks(text: str | None, world: int) -> list[int] | None:
    """``"0"``, ``"0,2"`` or ``"1-3"`` as rank numbers; ``None`` (every rank) without text.

    Example:
        >>> parse_ranks("0,2-3", 4)
        [0, 2, 3]
    """
    if text is None:
        return None
    accepted = f"ranks in [0, {world - 1}]: a number, a list (0,2) or a range (1-3)"
    ranks: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            first, last = int(low), int(high or low)
            ranks.update(range(first, last + 1))
    except ValueError:
        raise ConfigError("--ranks", text, accepted) from None
    if not ranks or min(ranks) < 0 or max(ranks) >= world:
        raise ConfigError("--ranks", text, accepted)
    return sorted(ranks)


@magics_class
class DistributedMagics(Magics):
    """The ``%%distributed`` cell magic (registered by ``%load_ext notebook_accel``)."""

    @magic_arguments()
    @argument(
        "session",
        nargs="?",
        help="the notebook's name of the Workers to run on (default: the latest opened)",
    )
    @argument("--ranks", help="only these ranks: 0, or 0,2, or 1-3 (default: every rank)")
    @argument("--timeout", type=float, help="interrupt the cell after this many seconds")
    @cell_magic
    def distributed(self, line: str, cell: str) -> None:
        """Run the cell on every worker of a session, in the workers' own namespace.

        Output, bars and charts appear as in a launch; the value of a last expression is
        printed by each rank. The code is plain Python (no magics in it).

        Example::

            %%distributed w --ranks 0
            print(model.weight.norm())
        """
        options = parse_argstring(self.distributed, line)
        workers = self._session(options.session)
        with UserFrames(SyntaxError):  # the workers' traceback and the cell, none of ours
            ranks = parse_ranks(options.ranks, workers.num_processes)
            workers.run_cell(cell, ranks=ranks, timeout=options.timeout)

    def _session(self, name: str | None) -> Workers:
        if name is None:
            found = latest()
            if found is None:
                raise UsageError(
                    "no open session: create one first, e.g. w = Workers(num_processes=2)"
                )
            return found
        value: Any = self.shell.user_ns.get(name) if self.shell is not None else None
        if not isinstance(value, Workers):
            raise UsageError(f"%%distributed {name}: {name!r} is not a Workers in this notebook")
        return value


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%distributed`` with an IPython shell."""
    ipython.register_magics(DistributedMagics)
