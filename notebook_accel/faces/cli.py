"""The command line: ``notebook-accel launch | config | env``.

notebook-accel launch [options] script.py [script args]
  options  -> LaunchConfig (the config file fills what is not given)
  the notebook launcher's engine runs the script in every worker (same rank-prefixed
  output, same errors); exit code 0, or 1 on failure. Several machines: the same path as the
  notebook's num_nodes (machine 0's table behind a gate that proves the job's secret,
  whole-group restarts: launch/meet/rendezvous.py, launch/meet/group.py)
  --cluster ray: the ranks run as Ray tasks (launch/cluster/ray/driver.py); the script's
  text travels
notebook-accel config [--default]   questions in the terminal -> the config file
notebook-accel config --reset       delete the config file (built-in defaults again)
notebook-accel env                  versions and hardware, for bug reports
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import env, hardware
from ..config import LaunchConfig, load_file, options, reset_file, save_file
from ..errors import ConfigError, NotebookAccelError, RemoteTraceback

__all__ = ["build_parser", "config_from", "main"]


def _flags(table: type[LaunchConfig] = LaunchConfig) -> dict[str, str]:
    """Command-line flag -> launch option (the table's Cli entries: HF accelerate's names)."""
    return {spec.cli.flag: name for name, spec in options(table).items() if spec.cli is not None}


_FIELD_TO_OPTION = {field: f"--{flag}" for flag, field in _flags().items()}
_FIELD_TO_OPTION["script"] = "script"
_FIELD_TO_OPTION["rendezvous_timeout"] = "--rendezvous_timeout"


def _add(parser: argparse.ArgumentParser, name: str, default: Any = None, **kwargs: Any) -> None:
    # Both spellings, --num_processes (accelerate's) and --num-processes.
    spellings = [f"--{name}"]
    if "_" in name:
        spellings.append(f"--{name.replace('_', '-')}")
    parser.add_argument(*spellings, dest=name, default=default, **kwargs)


def _launch_parser(sub: Any, table: type[LaunchConfig]) -> None:
    p = sub.add_parser(
        "launch",
        help="run a training script on every process (and machine)",
        description="Run SCRIPT in every worker process. Options not given come from the "
        "config file (`notebook-accel config`).",
        allow_abbrev=False,
    )
    for spec in options(table).values():  # the launch options, as the table spells them
        if spec.cli is not None:
            _add(
                p,
                spec.cli.flag,
                default=spec.unset,  # not given: the config file's
                type=spec.cli.parse,
                choices=spec.choices or None,
                metavar=spec.cli.metavar,
                help=spec.doc.replace("``", "").replace("%", "%%"),
            )
    p.add_argument(
        "--use_deepspeed",
        "--use-deepspeed",
        dest="use_deepspeed",
        action="store_true",
        help="train with DeepSpeed's ZeRO (the deepspeed extra)",
    )
    _add(p, "zero_stage", type=int, metavar="N", help="DeepSpeed's ZeRO stage, 0-3 (default 2)")
    _add(p, "deepspeed_config_file", metavar="PATH", help="a DeepSpeed config JSON")
    _add(
        p,
        "rendezvous_timeout",
        type=float,
        metavar="SECONDS",
        help="how long machines wait for machine 0 (default 300)",
    )
    _add(p, "config_file", type=Path, metavar="PATH", help="another config file")
    p.add_argument("script", help="the Python script to run")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(handler=_launch)


def build_parser(table: type[LaunchConfig] = LaunchConfig) -> argparse.ArgumentParser:
    """The ``notebook-accel`` argument parser (``table``: the launch options it offers).

    Example:
        >>> build_parser().parse_args(["env"]).command
        'env'
    """
    parser = argparse.ArgumentParser(
        prog="notebook-accel",
        allow_abbrev=False,
        description="Launch PyTorch training on several processes, as notebook_launcher does.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{launch,config,env}")
    _launch_parser(sub, table)
    c = sub.add_parser(
        "config", help="answer a few questions; writes the config file", allow_abbrev=False
    )
    c.add_argument("--default", action="store_true", help="write defaults without asking")
    c.add_argument(
        "--reset", action="store_true", help="delete the file: launches use built-in defaults"
    )
    _add(c, "config_file", type=Path, metavar="PATH", help="where to write")
    c.set_defaults(handler=_config)
    e = sub.add_parser("env", help="print versions and hardware, for bug reports")
    e.set_defaults(handler=_env)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``notebook-accel`` command; returns the exit code.

    Example:
        >>> main(["launch", "--num_processes", "2", "train.py"])  # doctest: +SKIP
        Launching 2 processes on CPU (gloo)
        0
    """
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"notebook-accel {args.command}: error: {_cli_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        notes = "".join(f"\n{note}" for note in getattr(exc, "__notes__", ()))  # where ranks were
        print(f"notebook-accel {args.command}: interrupted{notes}", file=sys.stderr)
        return 130


def _cli_message(exc: NotebookAccelError) -> str:
    """A ConfigError in the command line's words: ``--machine_rank=2`` not ``node_rank=2``."""
    message = str(exc)
    for field, option in _FIELD_TO_OPTION.items():
        message = message.replace(f"{field}=", f"{option}=")
    message = message.replace("zero_stage=", "--zero_stage=")
    return message.replace("num_nodes >", "--num_machines >")


# -- launch ---------------------------------------------------------------------------------
def config_from(args: argparse.Namespace, table: type[LaunchConfig] = LaunchConfig) -> LaunchConfig:
    """The launch options ``notebook-accel launch`` was given (the config file fills the rest)."""
    given = {field: getattr(args, flag) for flag, field in _flags(table).items()}
    deepspeed = _deepspeed_option(args)
    if deepspeed is not None:
        given["deepspeed"] = deepspeed
        if args.fsdp is None:  # the command line's DeepSpeed wins over the file's FSDP
            given["fsdp"] = False
    return table.from_defaults(args.config_file, **given)


def _deepspeed_option(args: argparse.Namespace) -> dict[str, Any] | None:
    """accelerate's --use_deepspeed / --zero_stage / --deepspeed_config_file as plugin fields
    (either of the last two implies the first)."""
    fields: dict[str, Any] = {}
    if args.zero_stage is not None:
        fields["zero_stage"] = args.zero_stage
    if args.deepspeed_config_file is not None:
        fields["hf_ds_config"] = str(Path(args.deepspeed_config_file).absolute())
    if not fields and not args.use_deepspeed:
        return None
    return fields


def _launch(args: argparse.Namespace) -> int:
    from ..launch import launch
    from ..launch.wire.script import checked_script, run_script, run_script_text

    script = checked_script(args.script)
    config = config_from(args)
    if args.rendezvous_timeout is not None and not args.rendezvous_timeout > 0:
        raise ConfigError("rendezvous_timeout", args.rendezvous_timeout, "seconds > 0")
    function: Callable[..., None] = run_script
    call: tuple[Any, ...] = (script, list(args.script_args))
    if config.cluster is not None:  # other machines may not have the file: send its text
        function = run_script_text
        call = (script, Path(script).read_text(encoding="utf-8"), list(args.script_args))
    try:
        launch(function, call, None, config, wait_for_machine_0=args.rendezvous_timeout)
    except ConfigError:
        raise
    except SystemExit as exc:  # the script called sys.exit(n) with n != 0 on some rank
        code = exc.code if isinstance(exc.code, int) else 1
        print(
            f"notebook-accel launch: {_rank_of(exc)}the script exited with {exc.code!r}",
            file=sys.stderr,
        )
        return code or 1
    except Exception as exc:
        _report(exc)
        return 1
    return 0


def _rank_of(exc: BaseException) -> str:
    rank = getattr(exc, "rank", None)
    return f"rank {rank}: " if rank is not None else ""


def _report(exc: BaseException) -> None:
    """The worker's own traceback, then one line naming the error: what a user needs."""
    cause = exc.__cause__
    if isinstance(cause, RemoteTraceback):
        print(cause.traceback_text.rstrip(), file=sys.stderr)
    notes = "".join(f"\n{note}" for note in getattr(exc, "__notes__", ()))
    text = _cli_message(exc) if isinstance(exc, NotebookAccelError) else str(exc)
    print(f"notebook-accel launch: {type(exc).__name__}: {text}{notes}", file=sys.stderr)


# -- config ---------------------------------------------------------------------------------
def _config(args: argparse.Namespace) -> int:
    from .cli_questions import ask_config

    if args.reset:
        print(f"Removed {reset_file(args.config_file)}")
        return 0
    machine = hardware.detect()
    if args.default:
        kind = hardware.kinds(machine)[0]
        config = LaunchConfig(num_processes=kind.default_processes(machine) or None)
    else:
        config = ask_config(machine, LaunchConfig(**load_file(args.config_file)))
    path = save_file(config, args.config_file)
    print(f"Saved to {path}")
    return 0


# -- env ------------------------------------------------------------------------------------
def _version(module: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cuda_lines(machine: hardware.Machine) -> list[str]:
    """The GPUs found, their compute capability and precisions, and how they were found."""
    counts: dict[str, int] = {}
    for name in machine.cuda_names:
        counts[name] = counts.get(name, 0) + 1
    found = ", ".join(f"{n} × {name}" for name, n in counts.items()) or "none"
    cap = machine.cuda_capability
    if machine.cuda_names:
        cuda = next(k for k in hardware.kinds(machine) if k.name == "cuda")
        offers = ", ".join(p for p in cuda.precisions(machine) if p != "no")
        known = f"{cap[0]}.{cap[1]}" if cap else "unknown"
        found += f" (compute capability {known}" + (f"; precisions: {offers})" if offers else ")")
    lines = [f"- CUDA GPUs: {found}"]
    if machine.cuda_method:
        lines.append(f"    found by: {machine.cuda_method}")
    if machine.cuda_mig:
        lines.append(
            "    MIG: a CUDA process sees one MIG device and NCCL does not span them, "
            "so a launch here runs 1 process"
        )
    return lines


def _env(args: argparse.Namespace) -> int:
    import platform

    machine = hardware.detect()
    lines = [
        f"- notebook_accel: {_version('notebook_accel')}",
        f"- Python: {platform.python_version()} ({sys.executable})",
        f"- Platform: {platform.platform()}",
    ]
    packages = ("torch", "torch_xla", "torchao", "nvidia-ml-py", "cloudpickle", "tqdm")
    for package in (*packages, "ipykernel", "accelerate"):
        lines.append(f"- {package}: {_version(package)}")
    try:
        import torch

        lines.append(f"- torch built for CUDA: {torch.version.cuda or 'no'}")
    except ImportError:
        pass
    lines += [
        f"- CPU cores: {machine.cpu_cores}",
        *_cuda_lines(machine),
        f"- Apple MPS: {'yes' if machine.mps else 'no'}",
        f"- TPU devices on this host: {machine.tpu_cores or 'none'} {machine.tpu_type}".rstrip(),
        *([f"    found by: {machine.tpu_method}"] if machine.tpu_method else []),
        f"- Running in: {machine.place}",
        f"- Hardware 'auto' picks: {hardware.kinds(machine)[0].describe(machine)}",
    ]
    path = env.config_file()
    saved = load_file(path)
    lines.append(f"- Config file: {path} ({'exists' if path.exists() else 'absent'})")
    lines += [f"    {key}: {value!r}" for key, value in sorted(saved.items())]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
