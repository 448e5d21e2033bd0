"""accelerate's module paths here: what each provides and refuses, for README and the checks.

    SHIMS: accelerate's module -> ours (paths.py, with what each provides)
    provided(shim) / refused(shim)   read from paths.py's and refusals.py's tables (no torch,
                                     no accelerate)
    render_migration()               README's "Migrating from accelerate" section, generated
                                     (tests/test_surface.py compares the two): names per
                                     module, then the parameters refused by name
    accelerate_names(module)         accelerate's public names there (needs accelerate):
                                     tests/test_surface.py and benchmarks/surface.py

A module of accelerate's is one more entry in ``paths.SHIMS`` and ``paths.PROVIDED`` and a
key of ``refusals.REFUSED``.
"""

from __future__ import annotations

import importlib
import sys
import types

from . import refusals
from .paths import PROVIDED, SHIMS, UTILS
from .refusals import Reason

__all__ = ["OWN_NAMES", "SHIMS", "accelerate_names", "provided", "refused", "render_migration"]

# notebook_accel's own public names, which are not accelerate's: the package and utils carry
# them too, but the migration list names only accelerate's (tests/test_surface.py checks that
# every other name listed as provided is one of accelerate's there).
OWN_NAMES = frozenset(
    {
        "CheckpointError",
        "ConfigError",
        "FsdpConfig",
        "Job",
        "LaunchConfig",
        "LaunchError",
        "LaunchPanel",
        "LaunchTimeoutError",
        "NotebookAccelError",
        "PayloadError",
        "SessionClosedError",
        "SharedMemoryError",
        "WorkerDiedError",
        "WorkerError",
        "Workers",
        "clear_shared_cache",
        "last_metrics",
        "load_ipython_extension",
        "sessions",
        "set_shared_cache_limit",
        "shared_cache_info",
        "trange",
    }
)


def _reason(shim: str, name: str) -> Reason | None:
    """Why ``shim``'s ``name`` is refused (its own table, or utils' for a name it takes from
    there), or None."""
    if PROVIDED.get(shim, {}).get(name) == UTILS:
        return refusals.reason_for(UTILS, name)
    return refusals.reason_for(shim, name)


def _names(shim: str) -> list[str]:
    module = importlib.import_module(shim)
    names = {*dir(module), *refusals.REFUSED.get(shim, {})} - OWN_NAMES
    return sorted(n for n in names if not n.startswith("_"))


def provided(shim: str) -> list[str]:
    """accelerate's names ``shim`` provides (not :data:`OWN_NAMES`), sorted."""
    return [n for n in _names(shim) if _reason(shim, n) is None]


def refused(shim: str) -> dict[str, Reason]:
    """The names ``shim`` refuses, each with its reason."""
    return {n: r for n in _names(shim) if (r := _reason(shim, n)) is not None}


def accelerate_names(module: str) -> list[str]:
    """accelerate's public names in ``module``: attributes without a leading underscore that
    are not submodules (accelerate has no ``__all__``), less what its own imports bring from
    the standard library (``Any``, ``contextmanager``, a module's ``logger``...), which are
    not its API."""
    found = importlib.import_module(module)
    names = []
    for name in dir(found):
        value = getattr(found, name)
        if name.startswith("_") or isinstance(value, types.ModuleType) or name == "TYPE_CHECKING":
            continue
        origin = getattr(value, "__module__", None) or type(value).__module__
        if isinstance(origin, str) and origin != "builtins":
            if origin.split(".")[0] in sys.stdlib_module_names:
                continue
        names.append(name)
    return sorted(names)


def _code(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def render_migration() -> str:
    """README's "Migrating from accelerate" section (markdown, without its heading line)."""
    lines = [
        "Per module: the names provided, then accelerate's names that are not, by reason. A",
        "name not provided imports fine (`from notebook_accel.utils import X`, `hasattr`) but",
        "raises `NotProvidedError` (a `NotebookAccelError`) saying why and what to use",
        "instead when called.",
        "",
    ]
    for theirs, ours in SHIMS.items():
        lines.append(f"**`{theirs}` -> `{ours}`**")
        lines.append("")
        lines.append(f"- provided: {_code(provided(ours))}")
        by_reason: dict[Reason, list[str]] = {}
        for name, reason in refused(ours).items():
            by_reason.setdefault(reason, []).append(name)
        for reason, names in by_reason.items():
            lines.append(
                f"- not provided ({reason.why}; use {reason.instead}): {_code(sorted(names))}"
            )
        lines.append("")
    lines += _refused_parameters()
    return "\n".join(lines)


def _refused_parameters() -> list[str]:
    """README's lines for the parameters taken and refused when given a value, and the
    Accelerator's refused attributes (every other parameter and attribute of accelerate's
    is provided: tests/test_surface.py)."""
    lines = [
        "**Parameters and `Accelerator` attributes**",
        "",
        "Every parameter of accelerate's functions and classes provided above, and every "
        "public attribute of its `Accelerator` (with its methods' parameters), is taken here "
        "with accelerate's meaning, but these, which are taken and refused (`NotProvidedError`) "
        "when given a value other than their default:",
        "",
    ]
    grouped: dict[Reason, list[str]] = {}
    for where, table in refusals.PARAMETERS.items():
        for name, entry in table.items():
            grouped.setdefault(entry.reason, []).append(f"{where}({name}=)")
    for name, reason in refusals.ATTRIBUTES.items():
        grouped.setdefault(reason, []).append(f"Accelerator.{name}")
    for reason, names in grouped.items():
        lines.append(
            f"- refused when given a value ({reason.why}; needs {reason.missing}; use "
            f"{reason.instead}): {_code(names)}"
        )
    lines.append("")
    return lines
