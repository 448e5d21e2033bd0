"""HF accelerate's private names: the process-wide state its ``accelerate.state`` keeps.

accelerate's ``PartialState``, ``AcceleratorState`` and ``GradientState`` are Borgs: every
instance shares one class-level dict, ``_shared_state``, filled by the first one built. A
worker forked from a caller that used accelerate (a notebook that built an ``Accelerator``,
a test process) would find that dict filled with the caller's facts (its rank, its device,
its accumulation), and accelerate would believe it is initialised already. Read in
accelerate 1.15 and 1.16, unchanged (``_reset_state`` clears ``_shared_state``; the three
classes).

    what                      relies on                         where it differs
    forget_state (worker.py)  accelerate.state's PartialState,  a class without a dict
                                AcceleratorState, GradientState   ``_shared_state`` is left
                                and their ``_shared_state``       as it is
                                dicts
"""

from __future__ import annotations

import sys

__all__ = ["forget_state"]

_BORGS = ("PartialState", "AcceleratorState", "GradientState")


def forget_state() -> list[str]:
    """In a worker: empty the shared state of accelerate's Borgs, as accelerate's own
    ``_reset_state`` does, where this process inherited accelerate already imported (never
    imports it). Returns the classes emptied.

    Relies on ``accelerate.state.<class>._shared_state`` being a dict (checked).
    """
    state = sys.modules.get("accelerate.state")
    emptied = []
    for name in _BORGS:
        shared = getattr(getattr(state, name, None), "_shared_state", None)
        if isinstance(shared, dict) and shared:
            shared.clear()
            emptied.append(name)
    return emptied
