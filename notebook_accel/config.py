"""LaunchConfig: the validated choices of one launch, and the config file that stores defaults.

The launcher, the panel and the command line all go through this one dataclass, and read or
write the same JSON file (``env.config_file()``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from . import env
from .errors import ConfigError
from .options import rules

__all__ = [
    "Hardware",
    "MixedPrecision",
    "OutputMode",
    "LaunchConfig",
    "PrecisionType",
    "write_basic_config",
    "load_file",
    "save_file",
    "reset_file",
]

Hardware = Literal["auto", "cpu", "cuda", "tpu", "mps"]
MixedPrecision = Literal["no", "fp16", "bf16", "fp8"]


class PrecisionType(enum.StrEnum):
    """accelerate's names of the mixed precisions (members compare equal to the strings)."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


OutputMode = Literal["all", "main", "none"]
StartMethod = Literal["auto", "forkserver", "spawn"]
PlacementStrategy = Literal["PACK", "SPREAD"]

# The keys that the config file may hold; anything else in the file is ignored with a warning.
FILE_KEYS = (
    "hardware",
    "num_processes",
    "mixed_precision",
    "gradient_accumulation_steps",
    "seed",
    "output",
    "num_nodes",
    "node_rank",
    "master_addr",
    "master_port",
    "max_restarts",
    "fsdp",
    "deepspeed",
    "parallelism_config",
    "dynamo_backend",
)


def _choices(literal: Any) -> str:
    return ", ".join(repr(v) for v in get_args(literal))


def _check_literal(name: str, value: object, literal: Any) -> None:
    if value not in get_args(literal):
        raise ConfigError(name, value, f"one of {_choices(literal)}")


def _check_int(name: str, value: object, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = f"an int >= {minimum}" + (" or None" if optional else "")
        raise ConfigError(name, value, kind)


@dataclass(frozen=True)
class LaunchConfig:
    """Everything a launch needs besides the function and its arguments.

    Validated on construction: a wrong value raises :class:`ConfigError` naming the parameter,
    the value and what is accepted. Hardware-dependent checks (e.g. more processes than GPUs)
    happen in :func:`notebook_accel.hardware.resolve`.

    Example:
        >>> LaunchConfig(num_processes=2, mixed_precision="bf16").num_processes
        2
    """

    num_processes: int | None = None
    hardware: Hardware = "auto"
    mixed_precision: MixedPrecision = "no"
    gradient_accumulation_steps: int = 1
    seed: int | None = None
    output: OutputMode = "all"
    timeout: float | None = None
    num_nodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    max_restarts: int = 0
    start_method: StartMethod = "auto"
    # FSDP sharding for the Accelerator in the workers: None (DDP), a strategy name
    # ("full", "grad_op", "no_shard", "hybrid"), a dict of FsdpConfig fields or an FsdpConfig;
    # normalised to an FsdpConfig (or None) on construction.
    fsdp: Any = None
    # Where the ranks run (launch/cluster/backend.py): None for this machine, "ray" for the Ray
    # cluster this notebook joined (or RAY_ADDRESS names), "ray://HOST:PORT" for Ray Client.
    cluster: str | None = None
    # On a cluster, what each rank reserves ({"CPU": 4, "GPU": 1}) and how ranks are placed.
    resources_per_worker: Any = None
    placement_strategy: PlacementStrategy = "PACK"
    # DeepSpeed ZeRO for the workers' Accelerator: None (off), True, a ZeRO stage, a dict of
    # DeepSpeedPlugin fields or a plugin; normalised to a dict of fields (or None).
    deepspeed: Any = None
    # The workers' Accelerator's mesh: None, a ParallelismConfig or a dict of its fields;
    # normalised to a dict (or None).
    parallelism_config: Any = None
    # torch.compile in the workers' Accelerator.prepare: accelerate's backend name ("no",
    # "inductor", "aot_eager"...), any case; normalised to lower case.
    dynamo_backend: str = "no"
    # The fields whose value came from the config file (not the call), for the launch banner.
    from_file: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)
    file_path: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        # "Off" spellings that also override a saved choice (None means "take the file's").
        if self.seed is False:
            object.__setattr__(self, "seed", None)
        if self.fsdp is False or (isinstance(self.fsdp, str) and self.fsdp in ("no", "")):
            object.__setattr__(self, "fsdp", None)
        _check_int("num_processes", self.num_processes, 1, optional=True)
        _check_literal("hardware", self.hardware, Hardware)
        _check_literal("mixed_precision", self.mixed_precision, MixedPrecision)
        _check_int("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        _check_int("seed", self.seed, 0, optional=True)
        _check_literal("output", self.output, OutputMode)
        _check_literal("start_method", self.start_method, StartMethod)
        if self.timeout is not None and (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or self.timeout <= 0
        ):
            raise ConfigError("timeout", self.timeout, "a number of seconds > 0, or None")
        _check_int("num_nodes", self.num_nodes, 1)
        _check_int("node_rank", self.node_rank, 0)
        if not isinstance(self.master_addr, str) or not self.master_addr:
            raise ConfigError("master_addr", self.master_addr, "a host name or IP address")
        if self.master_port is not None:
            _check_int("master_port", self.master_port, 1)
            if self.master_port > 65535:
                raise ConfigError("master_port", self.master_port, "a TCP port in [1, 65535]")
        _check_int("max_restarts", self.max_restarts, 0)
        if self.fsdp is not None:
            from .options.fsdp import FsdpConfig  # imports torch: only when FSDP is asked for

            object.__setattr__(self, "fsdp", FsdpConfig.coerce(self.fsdp))
        self._check_cluster()
        self._coerce_options()
        rules.machines(
            num_nodes=self.num_nodes,
            node_rank=self.node_rank,
            master_port=self.master_port,
            cluster=self.cluster,
            resources_per_worker=self.resources_per_worker,
        )
        rules.together(
            fsdp=self.fsdp,
            deepspeed=self.deepspeed,
            mesh=self.parallelism_config,
            dynamo_backend=self.dynamo_backend,
        )
        if self.deepspeed is not None:
            rules.deepspeed_installed("deepspeed", self.deepspeed)

    def _check_cluster(self) -> None:
        if self.cluster is not None and (
            not isinstance(self.cluster, str)
            or not (self.cluster == "ray" or self.cluster.startswith("ray://"))
        ):
            raise ConfigError("cluster", self.cluster, "None, 'ray' or 'ray://HOST:PORT'")
        _check_literal("placement_strategy", self.placement_strategy, PlacementStrategy)
        resources = self.resources_per_worker
        if resources is not None:
            accepted = "a dict of resource name -> amount >= 0, e.g. {'CPU': 4, 'GPU': 1}"
            if not isinstance(resources, dict) or not all(
                isinstance(k, str)
                and isinstance(v, int | float)
                and not isinstance(v, bool)
                and v >= 0
                for k, v in resources.items()
            ):
                raise ConfigError("resources_per_worker", resources, accepted)

    def _coerce_options(self) -> None:
        """DeepSpeed's, the mesh's and torch.compile's options in their stored forms."""
        from .options import deepspeed, dynamo, parallelism  # torch-free

        object.__setattr__(self, "deepspeed", deepspeed.coerce_option(self.deepspeed))
        mesh = parallelism.coerce_option(self.parallelism_config)
        object.__setattr__(self, "parallelism_config", mesh)
        object.__setattr__(self, "dynamo_backend", dynamo.coerce_option(self.dynamo_backend))

    def replace(self, **changes: Any) -> LaunchConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def worker_options(self) -> dict[str, str]:
        """The choices the workers' Accelerator reads (``env.launch_option(name)``)."""
        out = {
            "mixed_precision": self.mixed_precision,
            "gradient_accumulation_steps": str(self.gradient_accumulation_steps),
        }
        if self.seed is not None:
            out["seed"] = str(self.seed)
        if self.fsdp is not None:
            out["fsdp"] = self.fsdp.to_option()
        if self.deepspeed is not None:
            out["deepspeed"] = json.dumps(self.deepspeed)
        if self.parallelism_config is not None:
            out["parallelism_config"] = json.dumps(self.parallelism_config)
        if self.dynamo_backend != "no":
            out["dynamo_backend"] = self.dynamo_backend
        return out

    def file_values(self) -> dict[str, Any]:
        """The values that belong in the config file (JSON types only)."""
        values = {key: getattr(self, key) for key in FILE_KEYS}
        if self.fsdp is not None:
            values["fsdp"] = json.loads(self.fsdp.to_option())
        return values

    @classmethod
    def from_defaults(cls, path: Path | None = None, **given: Any) -> LaunchConfig:
        """Built-in defaults, overridden by the config file, overridden by ``given``.

        Arguments passed as ``None`` count as not given (the file's value, if any, is used).
        ``seed=False`` and ``fsdp=False`` (or ``"no"``) clear a seed or FSDP choice the file
        holds. ``from_file`` names the values that the file decided and that differ from the
        built-in defaults.
        """
        path = path or env.config_file()
        saved = load_file(path)
        values: dict[str, Any] = dict(saved)
        values.update({k: v for k, v in given.items() if v is not None})
        known = {f.name for f in fields(cls)}
        defaults = {f.name: f.default for f in fields(cls)}
        decided = tuple(
            k for k, v in saved.items() if k in known and given.get(k) is None and v != defaults[k]
        )
        chosen = {k: v for k, v in values.items() if k in known}
        return cls(**chosen, from_file=decided, file_path=str(path))

    def file_note(self) -> str:
        """One line for the launch banner: which values came from the config file, if any.

        Example:
            >>> LaunchConfig(seed=3, from_file=("seed",)).file_note()  # doctest: +ELLIPSIS
            'From the config file ...: seed=3 ...'
        """
        if not self.from_file:
            return ""
        shown = []
        for key in self.from_file:
            value = getattr(self, key)
            if key == "fsdp" and value is not None:
                value = value.sharding_strategy
            shown.append(f"{key}={value!r}")
        return (
            f"From the config file {self.file_path}: {', '.join(shown)} (an argument "
            "overrides each; seed=False or fsdp=False clears a saved one; "
            "notebook_accel.config.reset_file() or `notebook-accel config --reset` "
            "empties the file)"
        )


def load_file(path: Path | None = None) -> dict[str, Any]:
    """The saved defaults; a missing file gives ``{}``, a broken one a warning and ``{}``."""
    path = path or env.config_file()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.warn(
            f"notebook_accel: cannot read {path} ({exc}); using the defaults.", stacklevel=2
        )
        return {}
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the top level is not a JSON object")
        values = {k: v for k, v in data.items() if k in FILE_KEYS}
        LaunchConfig(**values)  # validate the file's values as a whole
    except (ValueError, TypeError) as exc:
        warnings.warn(
            f"notebook_accel: the config file {path} is not valid ({exc}); using the defaults. "
            "Fix or delete the file, or save new choices from the panel or "
            "`notebook-accel config`.",
            stacklevel=2,
        )
        return {}
    return values


def save_file(config: LaunchConfig, path: Path | None = None) -> Path:
    """Write the config file atomically (a temporary file renamed into place)."""
    path = path or env.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(config.file_values(), handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def reset_file(path: Path | None = None) -> Path:
    """Delete the config file: later launches use the built-in defaults again.

    Example:
        >>> from notebook_accel.config import reset_file
        >>> reset_file()  # doctest: +SKIP
        PosixPath('/home/me/.config/notebook_accel/config.json')
    """
    path = path or env.config_file()
    path.unlink(missing_ok=True)
    return path


def write_basic_config(
    mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None
) -> Path | bool:
    """accelerate's ``write_basic_config``: a config file with ``mixed_precision`` and the
    built-in defaults for everything else (every GPU of this machine, else the CPU).

    At the default location (``env.config_file()``) every later launch reads it: a
    ``notebook_launcher`` argument that is not given takes the file's value. At another
    ``save_location``, ``notebook-accel launch --config_file PATH`` reads it. As accelerate's,
    it leaves an existing file alone (prints a line and returns False).

    Args:
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"`` (any case).
        save_location: where to write; None for the default location.

    Returns:
        The path written, or False when a file was there already.

    Example:
        >>> from notebook_accel.utils import write_basic_config
        >>> write_basic_config(mixed_precision="bf16")  # doctest: +SKIP
        PosixPath('/home/me/.config/notebook_accel/config.json')
    """
    path = Path(save_location) if save_location is not None else env.config_file()
    if path.exists():
        print(
            f"Configuration already exists at {path}, will not override. Run "
            "`notebook-accel config` or pass a different `save_location`."
        )
        return False
    precision = str(mixed_precision).lower()
    if precision not in get_args(MixedPrecision):
        raise ConfigError("mixed_precision", mixed_precision, f"one of {_choices(MixedPrecision)}")
    return save_file(LaunchConfig(mixed_precision=precision), path)  # type: ignore[arg-type]
