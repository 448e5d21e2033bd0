"""One number from whatever a user logs: the conversion the live chart and trackers share."""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["scalar"]


def scalar(value: Any) -> float | None:
    """``value`` as a float if it is one number (int, float, numpy or 1-element tensor)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    try:
        count = numel() if callable(numel) else numel
        if count == 1 and hasattr(value, "item"):
            return float(value.item())
    except (TypeError, ValueError, RuntimeError):
        return None
    return None
