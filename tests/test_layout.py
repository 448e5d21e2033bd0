"""The package's folders are its parts, and imports between them run one way.

Every import statement of every module is read with ``ast``: those at the top, inside
functions and under ``TYPE_CHECKING`` alike; ``from . import x`` counts as importing ``x``.

    faces  ->  launch  ->  reporting, hardware  ->  the ground (errors, env, config, options, ...)
               training ->  reporting            ->  the ground
               big_model                          ->  the ground

The launcher never imports the training side (a worker's seeding is the ground's), the
training side never imports the launcher or the faces, and no module reaches itself through
the modules it imports (a cycle of any length).

Inside the launcher, its rooms run one way too:

    launcher  ->  local, cluster  ->  rank, plan, show  ->  wire, meet
                                      (rank -> wire, meet; plan -> meet)
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_accel"

# part -> the parts it may import (itself always)
ALLOWED = {
    "ground": set(),
    "hardware": {"ground"},
    "reporting": {"ground"},
    "training": {"big_model", "reporting", "ground"},
    "big_model": {"ground"},
    "launch": {"reporting", "hardware", "ground"},
    "faces": {"launch", "reporting", "hardware", "ground"},
}


# the launcher's room -> the rooms it may import (itself always)
LAUNCH_ALLOWED = {
    "wire": set(),
    "meet": set(),
    "show": set(),
    "rank": {"wire", "meet"},
    "plan": {"meet"},
    "local": {"wire", "meet", "rank", "show", "plan"},
    "cluster": {"wire", "meet", "rank", "show", "plan"},
    "launcher": {"local", "cluster", "wire", "meet", "rank", "show", "plan"},
}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


MODULES = _modules()


def _known(name: str) -> str | None:
    """The package module that importing ``name`` loads (a name inside it: the module)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in MODULES else None


def _imports(module: str, source: str | None = None, is_package: bool = False) -> set[str]:
    if source is None:
        path, is_package = MODULES[module]
        source = path.read_text()
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                submodule = f"{prefix}.{alias.name}"
                names.append(submodule if submodule in MODULES else prefix)
        for name in names:
            known = _known(name)
            if known is not None and known != module:
                targets.add(known)
    return targets


GRAPH = {module: _imports(module) for module in MODULES}


def part(module: str) -> str:
    """Which part of the package ``module`` belongs to."""
    if module == "notebook_accel.demo":  # `python -m notebook_accel.demo`: the demo's entry
        return "faces"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ALLOWED:
        return parts[1]
    return "ground"  # __init__, errors, env, config, memory_probe, quiet, seeding, utils/, ...


def room(module: str) -> str:
    """Which room of the launcher ``module`` is in (the package itself: the launcher's face)."""
    parts = module.split(".")
    return "launcher" if len(parts) == 2 else parts[2]


def test_every_part_is_a_folder_and_the_ground_is_small() -> None:
    parts = ("hardware", "launch", "reporting", "training", "big_model", "faces", "options")
    for name in (*parts, "private"):
        assert (PACKAGE / name / "__init__.py").is_file(), name
    ground = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert ground == [
        "__init__.py",
        "big_modeling.py",
        "config.py",
        "demo.py",
        "env.py",
        "errors.py",
        "hooks.py",
        "local_sgd.py",
        "logging.py",
        "memory_probe.py",
        "quiet.py",
        "refusals.py",
        "seeding.py",
        "state.py",
        "surface.py",
        "tracking.py",
    ]


def test_imports_run_one_way_between_the_parts() -> None:
    wrong = [
        f"{module} ({part(module)}) imports {target} ({part(target)})"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if part(target) != part(module) and part(target) not in ALLOWED[part(module)]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_launcher_never_imports_the_training_side() -> None:
    reached = {
        target
        for module, targets in GRAPH.items()
        if part(module) == "launch"
        for target in targets
        if part(target) == "training"
    }
    assert not reached


def test_the_launchers_rooms_import_one_way() -> None:
    launch = {m for m in MODULES if part(m) == "launch"}
    assert {room(m) for m in launch} == set(LAUNCH_ALLOWED)
    wrong = [
        f"{module} ({room(module)}) imports {target} ({room(target)})"
        for module in sorted(launch)
        for target in sorted(GRAPH[module] & launch)
        if room(target) != room(module) and room(target) not in LAUNCH_ALLOWED[room(module)]
    ]
    assert not wrong, "\n".join(wrong)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that reach each other through imports (Tarjan's strongly
    connected components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_module_reaches_itself_through_its_imports() -> None:
    found = cycles(GRAPH)
    assert not found, "\n".join(" -> ".join(group) for group in found)


def test_the_cycle_search_sees_a_ring_of_three() -> None:
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(ring) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_reader_sees_imports_inside_functions_and_type_checking() -> None:
    # The two pairs this layout broke imported each other inside functions: the reader must
    # see such imports, or the test above would pass whatever the code did.
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .state import ProcessState\n"
        "def f():\n"
        "    from . import collectives\n"
    )
    seen = _imports("notebook_accel.training.probe", source)
    assert seen == {"notebook_accel.training.state", "notebook_accel.training.collectives"}
