"""TorchDynamoPlugin: accelerate's torch.compile settings, validated, torch-free.

    Accelerator(dynamo_backend="inductor")          -> TorchDynamoPlugin(backend="inductor")
    Accelerator(dynamo_plugin=TorchDynamoPlugin(...))
    notebook_launcher(dynamo_backend=...) / --dynamo_backend / the panel
        -> LaunchConfig.dynamo_backend (checked here, before any process starts)
        -> NOTEBOOK_ACCEL_DYNAMO_BACKEND in the workers -> the plugin's default backend
    ACCELERATE_DYNAMO_{BACKEND,MODE,USE_FULLGRAPH,USE_DYNAMIC,USE_REGIONAL_COMPILATION}
        -> the defaults of the fields left at None, as accelerate reads them
    plugin.to_kwargs() -> torch.compile's keyword arguments (training/compile.py)

The launcher validates a backend name here without importing torch.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from typing import Any

from .. import env
from ..errors import ConfigError

__all__ = [
    "COMPILE_MODES",
    "DynamoBackend",
    "TorchDynamoPlugin",
    "check_backend",
    "coerce_option",
]


class DynamoBackend(enum.StrEnum):
    """accelerate's backend names for ``torch.compile`` (``NO``: do not compile).

    Example:
        >>> DynamoBackend("INDUCTOR") is DynamoBackend.INDUCTOR
        True
    """

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


# torch.compile's modes (it refuses any other).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_BACKENDS = ", ".join(repr(b.value.lower()) for b in DynamoBackend)
_TRUE = ("1", "y", "yes", "t", "true", "on")
_FALSE = ("0", "n", "no", "f", "false", "off")
_PREFIX = "ACCELERATE_DYNAMO_"


def check_backend(name: str, value: object) -> DynamoBackend:
    """``value`` as a :class:`DynamoBackend` (any case; a member stays itself).

    Raises:
        ConfigError: not one of accelerate's backend names; it names ``name``.

    Example:
        >>> check_backend("dynamo_backend", "inductor").value
        'INDUCTOR'
    """
    if isinstance(value, DynamoBackend):
        return value
    if isinstance(value, str):
        try:
            return DynamoBackend(value.upper())
        except ValueError:
            pass
    raise ConfigError(name, value, f"one of {_BACKENDS} (any case)")


def _flag(variable: str) -> bool | None:
    """An ``ACCELERATE_DYNAMO_*`` switch: None when unset."""
    text = env.dynamo_setting(variable)
    if text is None:
        return None
    if text.strip().lower() in _TRUE:
        return True
    if text.strip().lower() in _FALSE:
        return False
    raise ConfigError(_PREFIX + variable, text, "a yes/no value: 1, 0, true, false, yes, no")


def _bool(name: str, value: object, optional: bool = False) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        raise ConfigError(name, value, "True or False" + (" or None" if optional else ""))


@dataclass
class TorchDynamoPlugin:
    """How ``Accelerator.prepare`` compiles models with ``torch.compile`` (accelerate's names).

    Fields left at ``None`` take accelerate's ``ACCELERATE_DYNAMO_*`` variables (in a rank of
    a launch with ``dynamo_backend``, ``ACCELERATE_DYNAMO_BACKEND`` says it, as under
    ``accelerate launch``), else the defaults below.

    Args:
        backend: a :class:`DynamoBackend` or its name in any case (``"inductor"``,
            ``"aot_eager"``, ``"eager"``...); ``"no"`` (the default) compiles nothing.
        mode: ``"default"``, ``"reduce-overhead"``, ``"max-autotune"`` or
            ``"max-autotune-no-cudagraphs"``.
        fullgraph: refuse graph breaks (default False).
        dynamic: dynamic shapes: True, False, or None (torch decides).
        options: a dict of backend options (not with a ``mode`` other than ``"default"``).
        disable: make ``torch.compile`` a no-op (for testing).
        use_regional_compilation: compile each block of a ``ModuleList`` of identical
            blocks (and the model's other parts separately) instead of the whole model:
            the blocks share one compiled graph, so a deep model compiles about as fast as
            one block.

    Raises:
        ConfigError: an unknown backend or mode, a non-bool switch, options with a mode.

    Example:
        >>> plugin = TorchDynamoPlugin(backend="inductor", use_regional_compilation=True)
        >>> plugin.backend.value, plugin.to_kwargs()
        ('INDUCTOR', {'backend': 'inductor'})
    """

    backend: Any = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = env.dynamo_setting("BACKEND")
        self.backend = check_backend("backend", self.backend or "no")
        if self.mode is None:
            self.mode = env.dynamo_setting("MODE") or "default"
        if self.mode not in COMPILE_MODES:
            raise ConfigError("mode", self.mode, "one of " + ", ".join(map(repr, COMPILE_MODES)))
        if self.fullgraph is None:
            self.fullgraph = bool(_flag("USE_FULLGRAPH"))
        if self.use_regional_compilation is None:
            self.use_regional_compilation = bool(_flag("USE_REGIONAL_COMPILATION"))
        if self.dynamic is None:
            self.dynamic = _flag("USE_DYNAMIC")
        _bool("fullgraph", self.fullgraph)
        _bool("dynamic", self.dynamic, optional=True)
        _bool("disable", self.disable)
        _bool("use_regional_compilation", self.use_regional_compilation)
        if self.options is not None and not isinstance(self.options, dict):
            raise ConfigError("options", self.options, "a dict of backend options, or None")
        if self.options and self.mode != "default":
            raise ConfigError(
                "options",
                self.options,
                f"None with mode={self.mode!r}",
                "torch.compile takes a mode or options, not both.",
            )

    @property
    def enabled(self) -> bool:
        """Whether ``prepare`` compiles (a backend other than ``NO``)."""
        return self.backend is not DynamoBackend.NO

    def to_dict(self) -> dict[str, Any]:
        """The fields, the backend as its lower-case name (accelerate's ``to_dict``)."""
        fields = copy.deepcopy(self.__dict__)
        fields["backend"] = self.backend.value.lower()
        return fields

    def to_kwargs(self) -> dict[str, Any]:
        """``torch.compile``'s keyword arguments: the fields that differ from the defaults
        (``use_regional_compilation`` is ours to act on, not torch's)."""
        defaults = {
            "backend": "no",
            "mode": "default",
            "fullgraph": False,
            "dynamic": None,
            "options": None,
            "disable": False,
        }
        fields = self.to_dict()
        return {k: fields[k] for k, default in defaults.items() if fields[k] != default}


def coerce_option(value: object) -> str:
    """The launcher's ``dynamo_backend`` (None: off) as a lower-case backend name.

    Example:
        >>> coerce_option("INDUCTOR"), coerce_option(None)
        ('inductor', 'no')
    """
    if value is None or value is False:
        return "no"
    return check_backend("dynamo_backend", value).value.lower()
