"""The launcher: the notebook's side of a launch, and what a rank runs.

    launcher.py   notebook_launcher, debug_launcher, launch: validate, then the attempts
    plan.py       the hardware plan and where each rank sits (Layout)
    local/        this machine: forkserver and zygote, idle pool, the Engine, sessions, TPU
    cluster/      the ranks elsewhere: the Backend interface, Ray
    rank/         a rank's side: the worker's entry, a session's loop, env:// routing
    meet/         where the ranks meet and the machines keep in step
    wire/         what travels: the payload, its pickling, shared memory, outcomes
    show/         what the notebook shows: lines, bars, the live chart

Imports between them run one way (tests/test_layout.py): ``wire``, ``meet`` and ``show``
import nothing else of the launcher; ``rank`` may import ``wire`` and ``meet``; ``local`` and
``cluster`` those, ``rank``, ``show`` and ``plan``; only ``launcher`` imports ``local`` and
``cluster``.
"""

from __future__ import annotations

from .launcher import debug_launcher, launch, notebook_launcher, warm_up_early

__all__ = ["debug_launcher", "launch", "notebook_launcher", "warm_up_early"]
