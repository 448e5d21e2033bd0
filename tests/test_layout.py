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

    launcher  ->  local, cluster  ->  backend  ->  rank, plan, show  ->  wire, meet
                                  (the interface)   (rank -> wire, meet; plan -> meet)
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
    "backend": {"wire", "meet", "show", "plan"},
    "local": {"wire", "meet", "rank", "show", "plan", "backend"},
    "cluster": {"wire", "meet", "rank", "show", "plan", "backend"},
    "launcher": {"local", "cluster", "backend", "wire", "meet", "rank", "show", "plan"},
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
        "devices.py",
        "env.py",
        "errors.py",
        "hooks.py",
        "launched.py",
        "local_sgd.py",
        "logging.py",
        "memory_probe.py",
        "paths.py",
        "quiet.py",
        "refusals.py",
        "seeding.py",
        "signatures.py",
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
        "    from .process import ProcessState\n"
        "def f():\n"
        "    from . import collectives\n"
    )
    seen = _imports("notebook_accel.training.probe", source)
    assert seen == {"notebook_accel.training.process", "notebook_accel.training.collectives"}


# -- the layering at run time: no way around the arrows by name ------------------------------
# Modules that name another part's modules in strings, each for a reason (a string naming a
# package module is what importlib.import_module and sys.modules lookups take):
RUNTIME_NAMES = {
    "notebook_accel": "its public names, loaded on first use; load_ipython_extension; the "
    "early start",
    "notebook_accel.launch.local.forkserver": "the forkserver's preload: the modules its loop "
    "imports before serving (about 70 ms saved per worker)",
    "notebook_accel.paths": "accelerate's module paths: the table of what each of our "
    "shims provides (accelerate's names -> the parts holding them), loaded on first use",
}
# Reads of another module's private names, each for a reason.
PRIVATE_READS: dict[tuple[str, str], str] = {}
# Underscored names that are public API: os._exit, namedtuple's _fields.
PUBLIC_UNDERSCORED = {"_exit", "_fields"}


def _string_names(module: str) -> set[str]:
    """The package modules ``module`` names in string constants."""
    path, _ = MODULES[module]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("notebook_accel."):
                known = _known(node.value)
                if known is not None and known != module:
                    found.add(known)
    return found


def test_no_module_imports_around_the_arrows_by_name() -> None:
    wrong = [
        f"{module} ({part(module)}) names {target} ({part(target)})"
        for module in sorted(MODULES)
        if module not in RUNTIME_NAMES
        for target in sorted(_string_names(module))
        if part(target) != part(module) and part(target) not in ALLOWED[part(module)]
    ]
    assert not wrong, "\n".join(wrong)


def _own_names(tree: ast.AST) -> set[str]:
    """Every name a module defines or sets: functions, classes, variables, arguments,
    attributes it assigns (``x._y = ...``, ``setattr(x, "_y", ...)``), imported names."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Call) and _called(node, "setattr") and len(node.args) > 1:
            if isinstance(node.args[1], ast.Constant):
                names.add(str(node.args[1].value))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def _called(node: ast.Call, name: str) -> bool:
    return isinstance(node.func, ast.Name) and node.func.id == name


def private_reads(module: str, source: str | None = None) -> set[str]:
    """The private names ``module`` reads from objects that are not its own: ``x._y`` (not
    ``self``/``cls``) and ``getattr(x, "_y")``, where ``_y`` is nowhere defined or set in it."""
    if source is None:
        source = MODULES[module][0].read_text()
    tree = ast.parse(source)
    own = _own_names(tree)
    read = set()
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute) and not (
            isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        ):
            name = node.attr
        elif isinstance(node, ast.Call) and (_called(node, "getattr") or _called(node, "hasattr")):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                name = str(node.args[1].value)
        if name and name.startswith("_") and not name.startswith("__") and name not in own:
            read.add(name)
    return read - PUBLIC_UNDERSCORED


def test_no_module_reads_another_modules_private_names() -> None:
    # private/: the one place other projects' private names live (their job).
    wrong = [
        f"{module} reads {name}"
        for module in sorted(MODULES)
        if not module.startswith("notebook_accel.private.")
        for name in sorted(private_reads(module))
        if (module, name) not in PRIVATE_READS
    ]
    assert not wrong, "\n".join(wrong)


def test_the_private_read_check_sees_a_strangers_attribute() -> None:
    source = (
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._kept = 1\n"
        "def f(mine, other):\n"
        "    return mine._kept, other._strategy, getattr(other, '_hidden'), other._fields\n"
    )
    assert private_reads("notebook_accel.probe", source) == {"_strategy", "_hidden"}


# -- one definition per process fact ------------------------------------------------------
ALIASES = {
    "process_index",
    "local_process_index",
    "num_processes",
    "is_main_process",
    "is_local_main_process",
    "is_last_process",
    "use_distributed",
}


def test_environment_variables_are_read_through_named_accessors() -> None:
    wrong = [
        f"{module}:{node.lineno}"
        for module, (path, _) in sorted(MODULES.items())
        if module != "notebook_accel.env"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr in ("get", "_get")
        and isinstance(node.value, ast.Name)
        and node.value.id == "env"
    ]
    assert not wrong, "env.get outside env.py (add a named accessor there): " + ", ".join(wrong)


def test_accelerates_process_aliases_are_defined_once() -> None:
    """process_index, is_main_process, ...: ProcessView's alone, on the training side."""
    found = []
    for module, (path, _) in sorted(MODULES.items()):
        if part(module) != "training":
            continue
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in cls.body:
                names = set()
                if isinstance(node, ast.FunctionDef):
                    names = {node.name}
                elif isinstance(node, ast.Assign):
                    names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                for name in names & ALIASES:
                    found.append(f"{module}.{cls.name}.{name}")
    where = {entry.rsplit(".", 1)[0] for entry in found}
    assert where == {"notebook_accel.training.process.ProcessView"}, found


# accelerate 1.16's ranks along the mesh: an Accelerator's facts (its parallelism_config), so
# defined once, on the Accelerator (PartialState and AcceleratorState have no mesh).
MESH_RANKS = {
    "data_parallel_rank",
    "data_parallel_shard_rank",
    "tensor_parallel_rank",
    "context_parallel_rank",
    "pipeline_parallel_rank",
}


def test_the_mesh_ranks_are_defined_once() -> None:
    found = []
    for module, (path, _) in sorted(MODULES.items()):
        for cls in ast.walk(ast.parse(path.read_text())):
            if isinstance(cls, ast.ClassDef):
                names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
                found += [f"{module}.{cls.name}" for _ in names & MESH_RANKS]
    assert set(found) == {"notebook_accel.training.accelerator.Accelerator"}, found
    assert len(found) == len(MESH_RANKS)
