"""No silent gaps against accelerate 1.16 (the ``dev`` pin): every public name of its modules,
every parameter of each function and class provided, and every public attribute of its
``Accelerator`` (class and instance) resolves here, provided or refused on purpose with a
reason; README's migration section is the table rendered.

accelerate's public names in a module are its attributes without a leading underscore that
are not submodules (accelerate has no ``__all__``), less the standard library's objects its
imports bring (``surface.accelerate_names``); parameters and attributes: ``signatures.py``.
A later accelerate's additions fail these tests until each is provided or refused.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from notebook_accel import NotebookAccelError, refusals, surface
from notebook_accel.errors import NotProvidedError
from notebook_accel.refusals import Refused

README = Path(__file__).resolve().parents[1] / "README.md"
MODULES = sorted(surface.SHIMS.items())


def gaps(ours: str, names: list[str]) -> list[str]:
    """The names that resolve neither as provided nor as refused."""
    module = importlib.import_module(ours)
    return [name for name in names if not hasattr(module, name)]


@pytest.mark.parametrize(("theirs", "ours"), MODULES)
def test_every_public_name_of_accelerate_resolves_here(theirs: str, ours: str) -> None:
    pytest.importorskip("accelerate")
    names = surface.accelerate_names(theirs)
    assert names, theirs
    missing = gaps(ours, names)
    assert not missing, f"{ours} neither provides nor refuses: {missing}"


def test_the_gap_check_fails_on_a_name_nobody_listed() -> None:
    missing = gaps(
        "notebook_accel.utils", ["gather", "MegatronLMPlugin", "no_such_name", "dispatch_model"]
    )
    assert missing == ["no_such_name"]


@pytest.mark.parametrize(("theirs", "ours"), MODULES)
def test_what_the_table_names_is_accelerates(theirs: str, ours: str) -> None:
    """A refused name is one accelerate has there (no stale entries); a provided one is one
    of accelerate's, here or in another covered module (the package carries some of
    accelerate.utils' names at its top level, as utils carries the package's)."""
    pytest.importorskip("accelerate")
    here = set(surface.accelerate_names(theirs))
    anywhere = {n for module in surface.SHIMS for n in surface.accelerate_names(module)}
    assert set(surface.refused(ours)) <= here
    assert set(surface.provided(ours)) <= anywhere


@pytest.mark.parametrize("ours", sorted(refusals.REFUSED))
def test_no_name_is_both_provided_and_refused(ours: str) -> None:
    module = importlib.import_module(ours)
    own = set(getattr(module, "_EXPORTS", {})) | set(getattr(module, "_UTILS_ONLY", {}))
    both = own & set(refusals.REFUSED[ours])
    assert not both, f"{ours} provides {sorted(both)}: take them off refusals.REFUSED"


def test_a_refused_name_imports_and_says_why_when_used() -> None:
    import notebook_accel.utils
    from notebook_accel.utils import MegatronLMPlugin, is_hpu_available

    assert hasattr(notebook_accel.utils, "SageMakerDistributedType")
    assert issubclass(MegatronLMPlugin, Refused)
    assert not isinstance(object(), MegatronLMPlugin)
    with pytest.raises(NotProvidedError) as caught:
        MegatronLMPlugin(tp_degree=2)
    assert isinstance(caught.value, NotebookAccelError)
    assert isinstance(caught.value, NotImplementedError)
    message = str(caught.value)
    assert message.startswith("notebook_accel.utils.MegatronLMPlugin is not provided")
    assert "Megatron-LM is not supported" in message and "Use FSDP" in message
    with pytest.raises(NotProvidedError, match="device family"):
        is_hpu_available()
    from notebook_accel.state import SharedDict

    with pytest.raises(NotProvidedError, match="Borg"):
        SharedDict()
    # accelerate 1.16 removed PiPPy and MS-AMP: gone here too, as there
    for module, name in (
        (notebook_accel, "prepare_pippy"),
        (notebook_accel.utils, "MSAMPRecipeKwargs"),
        (notebook_accel.utils, "FP8RecipeKwargs"),
    ):
        assert not hasattr(module, name)


def test_a_name_neither_provided_nor_refused_is_an_attribute_error() -> None:
    import notebook_accel.state
    import notebook_accel.utils

    for module in (notebook_accel, notebook_accel.utils, notebook_accel.state):
        assert not hasattr(module, "no_such_name")
    with pytest.raises(ImportError):
        from notebook_accel.utils import no_such_name  # noqa: F401


def test_the_new_module_paths_import_no_torch() -> None:
    code = (
        "import sys\n"
        "import notebook_accel.state, notebook_accel.tracking, notebook_accel.utils\n"
        "import notebook_accel.utils.memory, notebook_accel.utils.dataclasses\n"
        "from notebook_accel.utils import MegatronLMPlugin, write_basic_config\n"
        "from notebook_accel.utils import patch_environment, is_rich_available\n"
        "from notebook_accel import surface\n"
        "surface.render_migration()\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def _readme_section() -> str:
    text = README.read_text()
    match = re.search(
        r"<!-- migration: begin.*?-->\n(.*?)<!-- migration: end -->", text, flags=re.DOTALL
    )
    assert match, "README has no generated migration section"
    return match.group(1)


def test_readme_migration_section_is_the_rendered_table() -> None:
    assert _readme_section() == surface.render_migration(), (
        "README's 'Migrating from accelerate' section differs from the table: run "
        "`python benchmarks/surface.py --write-readme`"
    )


# The names issue 30's census asked for at accelerate's paths (big-model ones aside): each
# takes accelerate's parameters, in accelerate's order (ours may add keyword-only extras).
SIGNATURES = [
    ("accelerate.utils", name)
    for name in (
        "broadcast broadcast_object_list gather reduce pad_across_processes send_to_device "
        "wait_for_everyone AutocastKwargs GradientAccumulationPlugin patch_environment "
        "synchronize_rng_states synchronize_rng_state extract_model_from_parallel "
        "merge_fsdp_weights is_bf16_available is_torch_xla_available is_rich_available "
        "write_basic_config str_to_bool parse_flag_from_env parse_choice_from_env "
        "get_int_from_env LoggerType PrecisionType RNGType set_seed gather_object "
        "DistributedType"
    ).split()
] + [
    ("accelerate.utils.memory", "clear_device_cache"),
    ("accelerate.state", "AcceleratorState"),
    ("accelerate.state", "GradientState"),
    ("accelerate.state", "is_initialized"),
]


@pytest.mark.parametrize(("theirs", "name"), SIGNATURES)
def test_the_census_names_take_accelerates_arguments(theirs: str, name: str) -> None:
    import enum
    import inspect

    pytest.importorskip("accelerate")
    a = getattr(importlib.import_module(theirs), name)
    o = getattr(importlib.import_module(surface.SHIMS[theirs]), name)
    if isinstance(a, type) and issubclass(a, enum.Enum):
        # ours may add a member, named as accelerate's own rule names it: MULTI_TPU
        extra = {("MULTI_TPU", "MULTI_TPU")} if name == "DistributedType" else set()
        assert {(m.name, m.value) for m in o} == {(m.name, m.value) for m in a} | extra
        assert str(next(iter(o))) == str(next(iter(a)))  # "DistributedType.NO" both
        return
    a, o = (a.__init__, o.__init__) if isinstance(a, type) else (a, o)

    def named(function: object) -> list[str]:
        kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        parameters = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
        return [p.name for p in parameters if p.kind not in kinds and p.name != "self"]

    theirs_names = [n for n in named(a) if not n.startswith("_")]
    assert named(o)[: len(theirs_names)] == theirs_names


# ---- parameters and the Accelerator's attributes (signatures.py) ---------------------------
def test_every_parameter_of_accelerate_is_taken_here() -> None:
    """Each function and class a shim provides takes every parameter of accelerate's (or
    refuses it by name), and no positional argument binds to another parameter."""
    from notebook_accel import signatures

    pytest.importorskip("accelerate")
    found = [
        signatures.census(where, theirs, ours, signatures.key_of(ours))
        for where, (theirs, ours) in signatures.callables().items()
    ]
    assert len(found) > 100
    gaps = {c.where: c.gaps for c in found if c.gaps}
    misbound = {c.where: c.misbound for c in found if c.misbound}
    assert not gaps, f"parameters neither taken nor refused: {gaps}"
    assert not misbound, f"positional arguments bound to another name: {misbound}"


def test_every_attribute_of_accelerates_accelerator_is_here() -> None:
    """Its class's and a CPU instance's public attributes (each made in a fresh process),
    and each method's parameters."""
    from notebook_accel import signatures

    pytest.importorskip("accelerate")
    attributes, methods = signatures.attribute_census()
    assert len(attributes.provided) + len(attributes.refused) > 100
    assert not attributes.gaps, f"Accelerator attributes missing here: {attributes.gaps}"
    wrong = {m.where: (m.gaps, m.misbound) for m in methods if m.gaps or m.misbound}
    assert not wrong, f"Accelerator methods' parameters: {wrong}"


def test_the_census_sees_gaps_refusals_and_misbinding() -> None:
    from notebook_accel import signatures

    def theirs(model, megatron_lm_plugin=None, steps=1, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None

    def ours(model, *, steps: int = 1, **kwargs: object) -> None:
        return None

    def swapped(steps: int, model: object, megatron_lm_plugin: object = None) -> None:
        return None

    found = signatures.census("theirs", theirs, ours, "Accelerator")
    assert (found.provided, found.gaps, found.misbound) == (
        ["model", "steps"],
        ["megatron_lm_plugin"],
        [],
    )
    found = signatures.census("theirs", theirs, swapped, "Accelerator")
    assert list(found.refused) == ["megatron_lm_plugin"] and not found.gaps
    assert found.misbound == [
        (0, "model", "steps"),
        (1, "megatron_lm_plugin", "model"),
        (2, "steps", "megatron_lm_plugin"),
    ]


def test_a_refusal_of_a_parameter_or_attribute_names_the_missing_software() -> None:
    reasons = [
        (f"{where}({name}=)", entry.reason)
        for where, table in refusals.PARAMETERS.items()
        for name, entry in table.items()
    ] + [(f"Accelerator.{name}", reason) for name, reason in refusals.ATTRIBUTES.items()]
    assert reasons
    vague = [where for where, reason in reasons if not reason.missing.strip()]
    assert not vague, f"refused without naming the missing software: {vague}"


def _refusing_calls() -> dict[str, object]:
    import torch

    import notebook_accel
    from notebook_accel.big_modeling import load_checkpoint_in_model
    from notebook_accel.config import LaunchConfig
    from notebook_accel.utils import set_module_tensor_to_device

    layer = torch.nn.Linear(1, 1)
    return {
        "Accelerator": lambda **kw: notebook_accel.Accelerator(cpu=True, **kw),
        # notebook_launcher's options are the table's fields, checked before any process
        "notebook_launcher": lambda **kw: LaunchConfig(**kw),
        "load_checkpoint_in_model": lambda **kw: load_checkpoint_in_model(
            layer, "no-such-file", **kw
        ),
        "set_module_tensor_to_device": lambda **kw: set_module_tensor_to_device(
            layer, "weight", "cpu", **kw
        ),
    }


def test_a_refused_parameter_is_taken_and_refuses_any_value_but_its_default() -> None:
    calls = _refusing_calls()
    assert set(calls) == set(refusals.PARAMETERS)  # a new refusal needs a call here
    for where, table in refusals.PARAMETERS.items():
        for name, entry in table.items():
            with pytest.raises(NotProvidedError) as caught:
                calls[where](**{name: object()})  # type: ignore[operator]
            assert f"{where}({name}=" in str(caught.value), (where, name)
            assert entry.reason.why in str(caught.value)
    # at its default it passes the refusal (the call then goes on)
    refusals.refuse_given("notebook_launcher", monitor_interval=0.1, rdzv_backend="static")
