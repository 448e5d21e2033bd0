"""errors.show_notes_in_ipython: an exception's notes (PEP 678) in IPython's tracebacks, once.

IPython 8 and later show notes by themselves: nothing is changed there. IPython 7.34
(Colab's) drops them: the matrix's colab job runs the kernel tests that read the launcher's
notes in a cell's traceback there; here a formatter that drops them stands in for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from notebook_accel.errors import show_notes_in_ipython


@pytest.fixture
def shell() -> Iterator[Any]:
    shell = InteractiveShell.instance()
    try:
        yield shell
    finally:
        InteractiveShell.clear_instance()


NOTE = "[notebook_accel] the session is still usable"


def _shown(shell: Any) -> list[str]:
    """The traceback's lines as the shell shows them (the source lines quote no note)."""
    try:
        raise ValueError("bad batch")
    except ValueError as exc:
        exc.add_note(NOTE)
        lines = shell.InteractiveTB.structured_traceback(ValueError, exc, exc.__traceback__)
    return "\n".join(lines).splitlines()


def test_an_ipython_that_shows_notes_shows_each_once(shell: Any) -> None:
    show_notes_in_ipython()
    show_notes_in_ipython()
    assert _shown(shell).count(NOTE) == 1


def test_a_formatter_that_drops_notes_gets_them_under_the_exception(shell: Any) -> None:
    formatter = shell.InteractiveTB
    showing = formatter.structured_traceback

    def dropping(etype: Any, evalue: Any, *args: Any, **kwargs: Any) -> list[str]:
        notes = getattr(evalue, "__notes__", [])
        lines = showing(etype, evalue, *args, **kwargs)
        return [line for line in lines if not any(note in line for note in notes)]

    formatter.structured_traceback = dropping  # as IPython 7.34's
    assert NOTE not in _shown(shell)
    show_notes_in_ipython()
    shown = _shown(shell)
    assert shown.count(NOTE) == 1
    assert shown[-1] == NOTE  # under the exception's line, as IPython 8 places it
