"""accelerate 1.15's public names per module, and how many notebook_accel provides.

For each module that scripts import from (``accelerate``, ``accelerate.utils``, ``.state``,
...): accelerate's public names (``surface.accelerate_names``), how many resolve in the
matching ``notebook_accel`` module as provided names, which it refuses on purpose (grouped
by reason, ``refusals.py``), and any name that is neither (a silent gap:
``tests/test_surface.py`` fails then).

    python benchmarks/surface.py                  # the counts and the refused names
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

from notebook_accel import surface  # noqa: E402
from notebook_accel.refusals import Reason, Refused  # noqa: E402


def report() -> int:
    """Print the table; the number of silent gaps is the exit status."""
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
    return 1 if gaps_total else 0


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
