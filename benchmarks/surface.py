"""accelerate's public names, parameters and Accelerator attributes, and notebook_accel's.

Against the installed accelerate (the reference: the ``dev``/``bench`` pin), three tables:

- names: for each module that scripts import from (``accelerate``, ``accelerate.utils``,
  ``.state``, ...), accelerate's public names (``surface.accelerate_names``), how many
  resolve in the matching ``notebook_accel`` module as provided names, which it refuses on
  purpose (grouped by reason, ``refusals.py``), and any name that is neither (a silent gap);
- parameters: for each function and class a shim provides (a dataclass: its init fields),
  accelerate's parameters that ours takes, refuses by name (``refusals.PARAMETERS``) or
  lacks, and positional parameters that would bind to another name (``signatures.py``);
- attributes: the public attributes of accelerate's ``Accelerator`` (its class and an
  instance made on CPU) that ours has, refuses (``refusals.ATTRIBUTES``) or lacks, and the
  parameters of each method.

``tests/test_surface.py`` fails on any silent gap.

    python benchmarks/surface.py                  # the tables
    python benchmarks/surface.py --write-readme   # regenerate README's migration section
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from notebook_accel import signatures, surface  # noqa: E402
from notebook_accel.refusals import Reason, Refused  # noqa: E402


def report() -> int:
    """Print the tables; 1 if anything is a silent gap."""
    names = report_names()
    calls = report_parameters()
    attributes = report_attributes()
    print(
        f"\nsilent gaps: names {names}, parameters {calls[0]} (misbound {calls[1]}), "
        f"Accelerator attributes {attributes[0]} (their parameters {attributes[1]})"
    )
    return 1 if names or any(calls) or any(attributes) else 0


def _row(found: signatures.Census) -> str:
    line = (
        f"  {found.where}: provided {len(found.provided)}, refused {len(found.refused)}, "
        f"silent gaps {len(found.gaps)}"
    )
    for name, reason in found.refused.items():
        line += f"\n    refused {name} ({reason.why})"
    if found.gaps:
        line += f"\n    SILENT GAPS: {', '.join(found.gaps)}"
    for position, theirs, ours in found.misbound:
        line += f"\n    MISBOUND: positional argument {position} is {theirs!r} there, {ours!r} here"
    return line


def report_parameters() -> tuple[int, int]:
    """The parameters of every provided function and class; (gaps, misbound)."""
    rows = [
        signatures.census(where, theirs, ours, signatures.key_of(ours))
        for where, (theirs, ours) in signatures.callables().items()
    ]
    return _totals("parameters of the functions and classes provided", rows)


def report_attributes() -> tuple[int, int]:
    """Accelerator's attributes, then its methods' parameters; (gaps, their parameters')."""
    found, methods = signatures.attribute_census()
    print(f"\nAccelerator's public attributes (class and a CPU instance): {_count(found)}")
    print(_row(found))
    gaps, misbound = _totals("parameters of the Accelerator's methods", methods)
    return len(found.gaps), gaps + misbound


def _count(found: signatures.Census) -> int:
    return len(found.provided) + len(found.refused) + len(found.gaps)


def _totals(title: str, rows: list[signatures.Census]) -> tuple[int, int]:
    total = sum(_count(r) for r in rows)
    provided = sum(len(r.provided) for r in rows)
    refused = sum(len(r.refused) for r in rows)
    gaps = sum(len(r.gaps) for r in rows)
    misbound = sum(len(r.misbound) for r in rows)
    print(
        f"\n{title}: {len(rows)} callables, {total} parameters; provided {provided}, "
        f"refused {refused}, silent gaps {gaps}, misbound {misbound}"
    )
    for found in rows:
        if found.refused or found.gaps or found.misbound:
            print(_row(found))
    return gaps, misbound


def report_names() -> int:
    """The names of each module; the number of silent gaps."""
    import accelerate

    print(f"accelerate {accelerate.__version__}: public names per module, and notebook_accel's")
    gaps_total = 0
    for theirs, ours in surface.SHIMS.items():
        names = surface.accelerate_names(theirs)
        module = importlib.import_module(ours)
        provided, gaps = [], []
        refused: dict[Reason, list[str]] = {}
        for name in names:
            value = getattr(module, name, None) if hasattr(module, name) else None
            if isinstance(value, type) and issubclass(value, Refused):
                refused.setdefault(value._reason, []).append(name)
            elif hasattr(module, name):
                provided.append(name)
            else:
                gaps.append(name)
        count = sum(len(v) for v in refused.values())
        print(
            f"\n{theirs} -> {ours}: {len(names)} names; provided {len(provided)}, "
            f"refused {count}, silent gaps {len(gaps)}"
        )
        for reason, refused_names in refused.items():
            print(f"  refused ({reason.why}): {', '.join(refused_names)}")
        if gaps:
            print(f"  SILENT GAPS: {', '.join(gaps)}")
        gaps_total += len(gaps)
    return gaps_total


def write_readme() -> None:
    """Replace README's generated migration section with the table rendered now."""
    readme = ROOT / "README.md"
    text = readme.read_text()
    pattern = re.compile(r"(<!-- migration: begin.*?-->\n).*?(<!-- migration: end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit("README.md has no '<!-- migration: begin ... -->' marker")
    section = surface.render_migration()
    readme.write_text(pattern.sub(lambda m: m.group(1) + section + m.group(2), text))
    print(f"wrote {readme}'s migration section ({len(section.splitlines())} lines)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-readme", action="store_true", help="regenerate README's section")
    args = parser.parse_args()
    if args.write_readme:
        write_readme()
        return 0
    return report()


if __name__ == "__main__":
    sys.exit(main())
