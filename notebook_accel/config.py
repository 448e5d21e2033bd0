"""LaunchConfig: the table of launch options, and the config file that stores defaults.

Each launch option is declared once, as a field of :class:`LaunchConfig` whose metadata is an
:class:`Option`: its default, how it is checked (and put in its one stored form), its words
in an error, its help line, and how each face spells it. Everything else is made from the
table:

    Option (a field of LaunchConfig)
      -> LaunchConfig(...)               each value checked, stored in its one form
      -> notebook_launcher / Workers     their parameters taken by name (given()), their Args
                                         documented (document())
      -> the config file                 written and read (file=True: save_file, load_file)
      -> notebook-accel launch --FLAG    the parser's flags (cli=Cli(...), faces/cli.py)
      -> the launch panel                its controls (panel=..., faces/panel.py)
      -> the workers                     the LaunchConfig itself, whole, in each rank's
                                         WorkerEnv (launch/plan.py); the Accelerator's
                                         defaults read from it (launched.py, worker=True);
                                         variables derived from it for user code and
                                         accelerate (variables=...)

Adding an option is one field here (tests/test_config.py adds one to a copy of the table).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from . import env, refusals
from .errors import ConfigError
from .options import rules

__all__ = [
    "DEFAULT",
    "Cli",
    "Hardware",
    "MixedPrecision",
    "Option",
    "OutputMode",
    "LaunchConfig",
    "PrecisionType",
    "document",
    "given",
    "option",
    "options",
    "write_basic_config",
    "load_file",
    "save_file",
    "reset_file",
]

Hardware = Literal["auto", "cpu", "cuda", "tpu", "mps"]
MixedPrecision = Literal["no", "fp16", "bf16", "fp8"]
OutputMode = Literal["all", "main", "none"]
StartMethod = Literal["auto", "forkserver", "spawn"]
PlacementStrategy = Literal["PACK", "SPREAD"]
Session = Literal["yes", "only", "refused", "no"]


class PrecisionType(enum.StrEnum):
    """accelerate's names of the mixed precisions (members compare equal to the strings)."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


# -- the declaration of one option -----------------------------------------------------------
Check = Callable[[str, Any], Any]  # (option's name, value) -> its stored form, or ConfigError


class _Default:
    """A launcher's parameter left out, for an option whose ``None`` is a value of its own."""

    def __repr__(self) -> str:
        return "DEFAULT"


# The launchers' default of such an option (stall_time: None turns the report off): the
# config file's value, else the table's.
DEFAULT: Any = _Default()


@dataclass(frozen=True)
class Cli:
    """How ``notebook-accel launch`` spells an option: ``--flag`` (accelerate's name, with its
    ``--flag-with-dashes`` twin), and how the text is read (``choices``: the option's own)."""

    flag: str
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None


@dataclass(frozen=True)
class Option:
    """One launch option: everything each face needs to know about it, said once.

    Attributes:
        check: ``(name, value) -> stored form``; raises ConfigError naming the option.
        doc: its help: notebook_launcher's and Workers' Args, the command line's help.
        choices: the accepted values, where they are a short list (the CLI's choices).
        file: kept in the config file (under its name).
        cli: its command-line flag, or None.
        panel: the launch panel's control that shows it (one the panel draws: "hardware",
            "processes", "precision", "accumulation", "sharding", "compile", "seed"; any
            other name: a plain control with that label), or None.
        session: ``"yes"``: ``Workers`` takes it; ``"only"``: ``Workers`` takes it and
            ``notebook_launcher`` does not (a session's own option); ``"refused"``: ``Workers``
            names it in a ConfigError (not for a session); ``"no"``: not a ``Workers``
            parameter.
        worker: the workers' ``Accelerator()`` takes it as its default (launched.option).
        variables: environment variables set in every worker from its value, for user code
            and accelerate's own classes (our code reads the LaunchConfig, never these).
        text: the value as those variables hold it (default ``str``); None: not set (the
            user's own value, if any, stays).
        unset: what a launcher's parameter holds when the call leaves it out (then the
            config file's value, else the default, is taken): ``None``, or :data:`DEFAULT`
            for an option whose ``None`` is a value of its own.
    """

    check: Check
    doc: str
    choices: tuple[Any, ...] = ()
    file: bool = True
    cli: Cli | None = None
    panel: str | None = None
    session: Session = "no"
    worker: bool = False
    variables: tuple[str, ...] = ()
    text: Callable[[Any], str | None] = str
    unset: Any = None


_OPTION = "notebook_accel.option"


def option(default: Any, **spec: Any) -> Any:
    """A field of the table: a launch option with its ``default`` and its :class:`Option`.

    Example:
        >>> @dataclass(frozen=True)
        ... class Mine(LaunchConfig):
        ...     retries: int = option(0, check=lambda name, value: value, doc="retries.")
        >>> Mine(retries=3).retries
        3
    """
    return dataclasses.field(default=default, metadata={_OPTION: Option(**spec)})


# -- checks: each returns the value in its stored form --------------------------------------
def _one_of(literal: Any) -> dict[str, Any]:
    """The check of a value from a Literal's list."""
    values = get_args(literal)
    accepted = "one of " + ", ".join(repr(v) for v in values)

    def check(name: str, value: Any) -> Any:
        if value not in values:
            raise ConfigError(name, value, accepted)
        return value

    return {"check": check, "choices": values}


def _int(minimum: int, optional: bool = False, maximum: int | None = None) -> Check:
    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            kind = f"an int >= {minimum}" + (" or None" if optional else "")
            raise ConfigError(name, value, kind)
        if maximum is not None and value > maximum:
            raise ConfigError(name, value, f"a TCP port in [{minimum}, {maximum}]")
        return value

    return check


def _seconds(name: str, value: Any) -> float | None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
    ):
        raise ConfigError(name, value, "a number of seconds > 0, or None")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(name, value, "True or False")
    return value


def _idle_time(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(name, value, "a number of seconds > 0")
    return float(value)


def _session_name(name: str, value: Any) -> str | None:
    if value is not None and (
        not isinstance(value, str)
        or not 0 < len(value) <= 64
        or value.startswith(".")
        or not all(c.isascii() and (c.isalnum() or c in "-_.") for c in value)
    ):
        raise ConfigError(name, value, "None or up to 64 letters, digits, '-', '_', '.'")
    return value


def _seed(name: str, value: Any) -> int | None:
    # False is the "off" spelling that also clears a saved seed (None means "take the file's").
    return _int(0, optional=True)(name, None if value is False else value)


def _address(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(name, value, "a host name or IP address")
    return value


def _fsdp(name: str, value: Any) -> Any:
    if value is None or value is False or value in ("no", ""):  # off, also over a saved one
        return None
    from .options.fsdp import FsdpConfig  # imports torch: only when FSDP is asked for

    return FsdpConfig.coerce(value)


def _cluster(name: str, value: Any) -> str | None:
    if value is not None and (
        not isinstance(value, str) or not (value == "ray" or value.startswith("ray://"))
    ):
        raise ConfigError(name, value, "None, 'ray' or 'ray://HOST:PORT'")
    return value


def _resources(name: str, value: Any) -> dict[str, float] | None:
    if value is not None and (
        not isinstance(value, dict)
        or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
            for k, v in value.items()
        )
    ):
        raise ConfigError(
            name, value, "a dict of resource name -> amount >= 0, e.g. {'CPU': 4, 'GPU': 1}"
        )
    return value


def _deepspeed(name: str, value: Any) -> dict[str, Any] | None:
    from .options import deepspeed  # torch-free

    return deepspeed.coerce_option(value)


def _mesh(name: str, value: Any) -> dict[str, Any] | None:
    from .options import parallelism  # torch-free

    return parallelism.coerce_option(value)


def _dynamo(name: str, value: Any) -> str:
    from .options import dynamo  # torch-free

    return dynamo.coerce_option(value)


def _host_port(endpoint: str) -> tuple[str, str]:
    host, colon, port = endpoint.rpartition(":")
    return (host, port) if colon else (endpoint, "")


def _endpoint(name: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    host, port = _host_port(value) if isinstance(value, str) else ("", "")
    if not host or (port and not port.isdigit()):
        raise ConfigError(name, value, "'HOST' or 'HOST:PORT' (machine 0's address)")
    if port and not 1 <= int(port) <= 65535:
        raise ConfigError(name, value, "'HOST:PORT' with a TCP port in [1, 65535]")
    return value


_WAITS = ("timeout", "join_timeout")  # rdzv_conf keys that mean the wait for machine 0


def _rdzv_conf(name: str, value: Any) -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(name, value, "a dict such as {'timeout': 900}, or None")
    for key, seconds in value.items():
        if key not in _WAITS:
            raise refusals.refuse(
                f"notebook_launcher(rdzv_conf={{{key!r}: ...}})", refusals.ELASTIC
            )
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
            raise ConfigError(f"{name}[{key!r}]", seconds, "seconds > 0")
    return dict(value)


def _refused(name: str, value: Any) -> Any:
    """accelerate's launcher parameters of torch elastic's agent: accepted at their defaults,
    refused by name otherwise (refusals.PARAMETERS)."""
    refusals.refuse_given("notebook_launcher", **{name: value})
    return value


def _seconds_or_off(text: str) -> float | None:
    """A command-line number of seconds, or ``none``/``off`` (ValueError, which argparse
    reports, otherwise)."""
    return None if text.strip().lower() in ("none", "off") else float(text)


def _json_object(text: str) -> Any:
    """A command-line value given as JSON (ValueError, which argparse reports, otherwise)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("a JSON object is expected, e.g. '{\"CPU\": 2}'")
    return value


def _lower(text: str) -> str:
    return text.lower()


# -- the table -----------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchConfig:
    """Everything a launch needs besides the function and its arguments: the launch options.

    Validated on construction: a wrong value raises :class:`ConfigError` naming the parameter,
    the value and what is accepted. Hardware-dependent checks (e.g. more processes than GPUs)
    happen in :func:`notebook_accel.hardware.resolve`.

    Example:
        >>> LaunchConfig(num_processes=2, mixed_precision="bf16").num_processes
        2
    """

    num_processes: int | None = option(
        None,
        check=_int(1, optional=True),
        doc="how many workers on this machine; default: every GPU / TPU core, or 2 on CPU.",
        cli=Cli("num_processes", "N", int),
        panel="processes",
        session="yes",
    )
    mixed_precision: MixedPrecision = option(
        "no",
        **_one_of(MixedPrecision),
        doc="``'no'``, ``'fp16'``, ``'bf16'`` or ``'fp8'`` (GPUs with compute capability "
        ">= 8.9, through torchao): the workers' ``Accelerator()`` default.",
        cli=Cli("mixed_precision"),
        panel="precision",
        session="yes",
        worker=True,
        variables=("NOTEBOOK_ACCEL_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION"),
    )
    hardware: Hardware = option(
        "auto",
        **_one_of(Hardware),
        doc="``'auto'``, ``'cpu'``, ``'cuda'``, ``'tpu'`` or ``'mps'``.",
        cli=Cli("hardware"),
        panel="hardware",
        session="yes",
    )
    output: OutputMode = option(
        "all",
        **_one_of(OutputMode),
        doc="whose output to show: ``'all'`` ranks, ``'main'`` (rank 0 only) or ``'none'``.",
        cli=Cli("output"),
        session="yes",
    )
    timeout: float | None = option(
        None,
        check=_seconds,
        doc="seconds after which the launch is stopped with LaunchTimeoutError: the whole "
        "launch, restarts included (each restart gets what is left); for a session, each run's.",
        file=False,
        cli=Cli("timeout", "SECONDS", float),
        session="yes",
    )
    stall_time: float | None = option(
        60.0,
        check=_seconds,
        doc="seconds without progress (no rank's output, bar, chart row, step or collective) "
        "after which the cell shows where every rank is, once, without stopping anything; "
        "``None`` turns that report off (a timeout's or the stop button's error still notes "
        "where every rank was).",
        cli=Cli("stall_time", "SECONDS|none", _seconds_or_off),
        panel="Stall report (s)",
        session="yes",
        unset=DEFAULT,
    )
    gradient_accumulation_steps: int = option(
        1,
        check=_int(1),
        doc="the workers' ``Accelerator()`` default.",
        panel="accumulation",
        session="yes",
        worker=True,
        variables=(
            "NOTEBOOK_ACCEL_GRADIENT_ACCUMULATION_STEPS",
            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
        ),
    )
    seed: int | None = option(
        None,
        check=_seed,
        doc="seed python's ``random``, numpy and torch in every worker (and the default for "
        "``Accelerator()`` there); ``False`` clears a seed saved in the config file.",
        panel="seed",
        session="yes",
        worker=True,
        variables=("NOTEBOOK_ACCEL_SEED",),
    )
    num_nodes: int = option(
        1,
        check=_int(1),
        doc="machines in the job; they meet at ``master_addr:master_port`` (machine 0), and "
        "each needs the job's secret (``NOTEBOOK_ACCEL_SECRET``, else the file "
        "``~/.config/notebook_accel/secret``, made at first use: copy it to the others).",
        cli=Cli("num_machines", "N", int),
        session="refused",
    )
    node_rank: int = option(
        0,
        check=_int(0),
        doc="this machine's rank, 0 .. num_nodes - 1.",
        cli=Cli("machine_rank", "R", int),
    )
    master_addr: str = option(
        "127.0.0.1",
        check=_address,
        doc="machine 0's address.",
        cli=Cli("main_process_ip", "ADDR"),
    )
    master_port: int | None = option(
        None,
        check=_int(1, optional=True, maximum=65535),
        doc="machine 0's port (``use_port``: accelerate's name for it).",
        cli=Cli("main_process_port", "PORT", int),
    )
    max_restarts: int = option(
        0,
        check=_int(0),
        doc="restart every worker (every machine's) up to this many times after a failure.",
        cli=Cli("max_restarts", "N", int),
        session="refused",
    )
    start_method: StartMethod = option(
        "auto",
        **_one_of(StartMethod),
        doc="``'auto'`` (forkserver, else spawn), ``'forkserver'`` or ``'spawn'``.",
        file=False,
        session="yes",
    )
    fsdp: Any = option(
        None,
        check=_fsdp,
        doc="shard models with FSDP in ``Accelerator.prepare``: a strategy name (``'full'``, "
        "``'grad_op'``, ``'no_shard'``, ``'hybrid'``), a dict of FsdpConfig fields (or its "
        "JSON), or an FsdpConfig; ``False`` (or ``'no'``) clears a saved choice.",
        cli=Cli("fsdp", "STRATEGY|JSON"),
        panel="sharding",
        session="yes",
        worker=True,
    )
    cluster: str | None = option(
        None,
        check=_cluster,
        doc="run the ranks on a cluster instead of this machine: ``'ray'`` (the Ray cluster "
        "this process joined with ``ray.init``, else the one ``RAY_ADDRESS`` names) or "
        "``'ray://HOST:PORT'`` (Ray Client); ``num_processes`` then counts every rank on the "
        "cluster, each a Ray task.",
        file=False,
        cli=Cli("cluster", "ray|ray://HOST:PORT"),
        session="refused",
    )
    resources_per_worker: dict[str, float] | None = option(
        None,
        check=_resources,
        doc="on a cluster, what each rank reserves, e.g. ``{'CPU': 4, 'GPU': 1}`` (default "
        "``{'CPU': 1}``); a GPU makes it a CUDA launch.",
        file=False,
        cli=Cli("resources_per_worker", "JSON", _json_object),
    )
    placement_strategy: PlacementStrategy = option(
        "PACK",
        **_one_of(PlacementStrategy),
        doc="on a cluster, ``'PACK'`` ranks on as few machines as possible or ``'SPREAD'`` "
        "them across machines.",
        file=False,
        cli=Cli("placement_strategy"),
    )
    deepspeed: dict[str, Any] | None = option(
        None,
        check=_deepspeed,
        doc="train with DeepSpeed's ZeRO in ``Accelerator.prepare`` (the ``deepspeed`` extra): "
        "``True`` (ZeRO-2), a ZeRO stage 0-3, a ``DeepSpeedPlugin`` or a dict of its fields; "
        "not with ``fsdp``; ``False`` clears a saved choice. (The command line spells it as "
        "accelerate does: ``--use_deepspeed``, ``--zero_stage``, ``--deepspeed_config_file``.)",
        panel="sharding",
        session="yes",
        worker=True,
    )
    parallelism_config: dict[str, Any] | None = option(
        None,
        check=_mesh,
        doc="the workers' mesh (a ``ParallelismConfig`` or a dict of its fields: "
        "``dp_replicate_size``, ``dp_shard_size``, ``tp_size``...); its sizes must multiply "
        "to the job's processes (checked before any process starts).",
        session="yes",
        worker=True,
    )
    dynamo_backend: str = option(
        "no",
        check=_dynamo,
        doc="compile models in ``Accelerator.prepare`` with ``torch.compile`` on this backend "
        "(accelerate's names, any case: ``'inductor'``, ``'aot_eager'``, ``'eager'``...; "
        "``'no'``, the default, runs eager): the workers' ``Accelerator()`` default.",
        cli=Cli("dynamo_backend", "BACKEND", _lower),
        panel="compile",
        session="yes",
        worker=True,
        variables=("ACCELERATE_DYNAMO_BACKEND",),
        text=lambda backend: None if backend == "no" else backend.upper(),
    )
    # accelerate's notebook_launcher parameters of torch elastic's launch (accelerate 1.16)
    rdzv_endpoint: str | None = option(
        None,
        check=_endpoint,
        doc="accelerate's ``'HOST[:PORT]'`` where the machines meet: machine 0's address (it "
        "sets ``master_addr`` and ``master_port``, which may not say otherwise).",
        file=False,
    )
    rdzv_conf: dict[str, float] | None = option(
        None,
        check=_rdzv_conf,
        doc="accelerate's rendezvous options: ``{'timeout': seconds}`` (or "
        "``'join_timeout'``) is how long the other machines wait for machine 0; torch "
        "elastic's other keys are refused by name.",
        file=False,
    )
    rdzv_backend: str = option(
        "static",
        check=_refused,
        doc="accelerate's rendezvous backend: ``'static'`` (machines meet at machine 0's "
        "address), the only one; torch elastic's ``'c10d'``/``'etcd'`` are refused by name.",
        file=False,
    )
    rdzv_id: str = option(
        "none",
        check=_refused,
        doc="accelerate's elastic run id: accepted at its default ``'none'``.",
        file=False,
    )
    monitor_interval: float = option(
        0.1,
        check=_refused,
        doc="accelerate's elastic agent's polling interval: accepted at its default ``0.1`` "
        "(workers are watched through their pipes, without polling).",
        file=False,
    )
    log_line_prefix_template: str | None = option(
        None,
        check=_refused,
        doc="accelerate's elastic log prefix: accepted at ``None`` (lines show ``[rank N]``).",
        file=False,
    )
    # a session's own options (Workers only): a durable session (launch/local/durable/)
    durable: bool = option(
        False,
        check=_flag,
        doc="the workers belong to a supervisor process of ours, not to this kernel: they, "
        "their namespace and their jobs outlive it; ``Workers.attach(name)`` in a later "
        "kernel takes them back (needs ``name``).",
        file=False,
        session="only",
    )
    name: str | None = option(
        None,
        check=_session_name,
        doc="a durable session's name (letters, digits, ``-``, ``_``, ``.``), unique among "
        "this user's open sessions on this machine.",
        file=False,
        session="only",
    )
    idle_time: float = option(
        12 * 3600.0,
        check=_idle_time,
        doc="a durable session nobody closed ends after this many seconds with no task "
        "running and no request from a kernel (default 12 hours).",
        session="only",
    )
    # Not options: which fields' values came from the config file, for the launch banner.
    from_file: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)
    file_path: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, spec in options(type(self)).items():
            object.__setattr__(self, name, spec.check(name, getattr(self, name)))
        self._meet_at_endpoint()
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

    def _meet_at_endpoint(self) -> None:
        """``rdzv_endpoint`` is machine 0's address: master_addr and master_port follow it
        (one that says otherwise is refused)."""
        if self.rdzv_endpoint is None:
            return
        host, port = _host_port(self.rdzv_endpoint)
        default = fields_default(type(self), "master_addr")
        if self.master_addr not in (default, host):
            raise ConfigError(
                "rdzv_endpoint", self.rdzv_endpoint, f"machine 0's address, {self.master_addr!r}"
            )
        object.__setattr__(self, "master_addr", host)
        if port:
            if self.master_port not in (None, int(port)):
                raise ConfigError(
                    "rdzv_endpoint", self.rdzv_endpoint, f"machine 0's port, {self.master_port}"
                )
            object.__setattr__(self, "master_port", int(port))

    def wait_for_machine_0(self) -> float | None:
        """Seconds the other machines wait for machine 0 (``rdzv_conf``'s ``timeout``), or
        None for the launcher's default."""
        conf = self.rdzv_conf or {}
        return next((float(conf[key]) for key in _WAITS if key in conf), None)

    def replace(self, **changes: Any) -> LaunchConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def worker_variables(self) -> dict[str, str]:
        """The variables every worker gets from these options (``Option.variables``): for
        user code and accelerate's classes; ours read the LaunchConfig itself."""
        out: dict[str, str] = {}
        for name, spec in options(type(self)).items():
            value = getattr(self, name)
            text = None if value is None else spec.text(value)
            if text is not None:
                out.update(dict.fromkeys(spec.variables, text))
        return out

    def plain(self) -> dict[str, Any]:
        """Every option's value in JSON types (an FsdpConfig as a dict of its fields)."""
        values = {name: getattr(self, name) for name in options(type(self))}
        if self.fsdp is not None:
            values["fsdp"] = json.loads(self.fsdp.to_option())
        return values

    def file_values(self) -> dict[str, Any]:
        """The values that belong in the config file (JSON types only)."""
        table = options(type(self))
        return {name: value for name, value in self.plain().items() if table[name].file}

    @classmethod
    def from_defaults(cls, path: Path | None = None, **given: Any) -> LaunchConfig:
        """Built-in defaults, overridden by the config file, overridden by ``given``.

        Arguments passed as ``None`` count as not given (the file's value, if any, is used),
        but for an option whose ``None`` is a value (``Option.unset``: :data:`DEFAULT` is its
        not given). ``seed=False`` and ``fsdp=False`` (or ``"no"``) clear a seed or FSDP
        choice the file holds. ``from_file`` names the values that the file decided and that
        differ from the built-in defaults.
        """
        path = path or env.config_file()
        saved = load_file(path, cls)
        table = options(cls)
        unknown = sorted(set(given) - set(table))
        if unknown:
            raise TypeError(f"not a launch option: {unknown[0]}")
        values: dict[str, Any] = dict(saved)
        values.update({k: v for k, v in given.items() if v is not table[k].unset})
        defaults = {f.name: f.default for f in fields(cls)}
        decided = tuple(
            k
            for k, v in saved.items()
            if k in table and given.get(k, table[k].unset) is table[k].unset and v != defaults[k]
        )
        chosen = {k: v for k, v in values.items() if k in table}
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


def fields_default(table: type[LaunchConfig], name: str) -> Any:
    """The built-in default of option ``name``."""
    return next(f.default for f in fields(table) if f.name == name)


def options(table: type[LaunchConfig] = LaunchConfig) -> dict[str, Option]:
    """The launch options of ``table`` (LaunchConfig, or a subclass adding some), in order.

    Example:
        >>> options()["output"].choices
        ('all', 'main', 'none')
    """
    return {f.name: f.metadata[_OPTION] for f in fields(table) if _OPTION in f.metadata}


def given(
    values: Mapping[str, Any], session: bool = False, table: type[LaunchConfig] = LaunchConfig
) -> dict[str, Any]:
    """The launch options among a call's arguments (``locals()`` of notebook_launcher, or of
    Workers with ``session``: the options a session takes)."""
    names = [
        name
        for name, spec in options(table).items()
        if spec.session in (("yes", "only") if session else ("yes", "no", "refused"))
    ]
    return {name: values[name] for name in names if name in values}


def document(doc: str | None, session: bool = False) -> str:
    """``doc`` with its ``{options}`` line replaced by the Args entry of every launch option
    that the call takes (a session's with ``session``), from the table's help.

    One place says what an option does: notebook_launcher's and Workers' docstrings and the
    command line's help are made from it.
    """
    lines = []
    for name, spec in options().items():
        if spec.session not in (("yes", "only") if session else ("yes", "no", "refused")):
            continue
        words = spec.doc.split()
        line, entry = f"        {name}:", []
        for word in words:
            if len(line) + 1 + len(word) > 96:
                entry.append(line)
                line = "            " + word
            else:
                line = f"{line} {word}"
        entry.append(line)
        lines.append("\n".join(entry))
    return (doc or "").replace("        {options}", "\n".join(lines))


def load_file(path: Path | None = None, table: type[LaunchConfig] = LaunchConfig) -> dict[str, Any]:
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
    keys = {name for name, spec in options(table).items() if spec.file}
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the top level is not a JSON object")
        values = {k: v for k, v in data.items() if k in keys}
        table(**values)  # validate the file's values as a whole
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
    options()["mixed_precision"].check("mixed_precision", precision)
    return save_file(LaunchConfig(mixed_precision=precision), path)  # type: ignore[arg-type]
