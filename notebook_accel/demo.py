"""``python -m notebook_accel.demo``: README's first command (the demo is ``faces/demo.py``).

This module is an entry point, counted among the faces.
"""

from __future__ import annotations

from .faces.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
