"""``notebook-accel config``: the questions asked in a terminal, answered one line each.

Every answer is checked at once; a wrong one is asked again with the reason. An empty
answer takes the default shown in brackets. The result is a validated LaunchConfig.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any, TypeVar

from .. import hardware
from ..config import LaunchConfig
from ..errors import ConfigError

__all__ = ["ask_config"]

T = TypeVar("T")
Ask = Callable[[str], str]


class _Aborted(ConfigError):
    pass


def _question(ask: Ask, text: str, default: T, parse: Callable[[str], T]) -> T:
    while True:
        try:
            raw = ask(f"{text} [{default}]: ").strip()
        except EOFError:
            raise _Aborted("config", "end of input", "an answer to every question") from None
        if not raw:
            return default
        try:
            return parse(raw)
        except ValueError as exc:
            print(f"  not accepted: {exc}")


def _choice(options: list[str]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw in options:
            return raw
        if raw.isdigit() and 1 <= int(raw) <= len(options):
            return options[int(raw) - 1]
        raise ValueError(f"{raw!r}; choose one of {', '.join(options)}")

    return parse


def _int(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw)
        if value < minimum or (maximum is not None and value > maximum):
            top = "" if maximum is None else f" and <= {maximum}"
            raise ValueError(f"{value}; expected an int >= {minimum}{top}")
        return value

    return parse


def _machines(ask: Ask, current: LaunchConfig) -> dict[str, Any]:
    nodes = _question(ask, "How many machines?", current.num_nodes, _int(1))
    if nodes == 1:
        return {"num_nodes": 1, "node_rank": 0}
    return {
        "num_nodes": nodes,
        "node_rank": _question(
            ask, "This machine's rank?", min(current.node_rank, nodes - 1), _int(0, nodes - 1)
        ),
        "master_addr": _question(ask, "Machine 0's address?", current.master_addr, str),
        "master_port": _question(
            ask, "Machine 0's port?", current.master_port or 29500, _int(1, 65535)
        ),
        "max_restarts": _question(
            ask,
            "Restart the group after a failure up to how many times?",
            current.max_restarts,
            _int(0),
        ),
    }


def ask_config(machine: hardware.Machine, current: LaunchConfig, ask: Ask = input) -> LaunchConfig:
    """Ask hardware, processes, precision, machines and DeepSpeed; defaults are the current
    values.

    Example:
        >>> answers = iter(["cpu", "4", "no", "1"])
        >>> ask_config(hardware.detect(), LaunchConfig(),
        ...            ask=lambda q: next(answers)).num_processes  # doctest: +SKIP
        4
    """
    kinds = {k.name: k for k in hardware.kinds(machine)}
    print("Hardware here: " + "; ".join(k.describe(machine) for k in kinds.values()))
    names = ["auto", *kinds]
    default_hw: str = current.hardware if current.hardware in names else "auto"
    hw = _question(ask, f"Which hardware ({', '.join(names)})?", default_hw, _choice(names))
    kind = kinds[hw] if hw != "auto" else next(iter(kinds.values()))
    bound = kind.count(machine) or None
    processes = _question(
        ask,
        "How many processes on this machine?",
        current.num_processes or kind.default_processes(machine),
        _int(1, bound),
    )
    precisions = list(kind.precisions(machine))
    default_mp: str = current.mixed_precision if current.mixed_precision in precisions else "no"
    precision = _question(
        ask, f"Mixed precision ({', '.join(precisions)})?", default_mp, _choice(precisions)
    )
    machines = _machines(ask, current)
    default_ds = "no" if current.deepspeed is None else str(current.deepspeed.get("zero_stage", 2))
    stage = _question(
        ask, "Use DeepSpeed? (no, or a ZeRO stage: 0, 1, 2, 3)", default_ds, _deepspeed_answer
    )
    deepspeed = None if stage == "no" else {**(current.deepspeed or {}), "zero_stage": int(stage)}
    return current.replace(
        hardware=hw,
        num_processes=processes,
        mixed_precision=precision,
        deepspeed=deepspeed,
        fsdp=None if deepspeed is not None else current.fsdp,
        **machines,
    )


def _deepspeed_answer(raw: str) -> str:
    answer = raw.lower()
    if answer in ("no", "n", "none"):
        return "no"
    if answer not in ("0", "1", "2", "3"):
        raise ValueError("no, 0, 1, 2 or 3")
    if importlib.util.find_spec("deepspeed") is None:
        raise ValueError(
            "the deepspeed package is not installed (pip install 'notebook-accel[deepspeed]' "
            "--no-build-isolation, after torch)"
        )
    return answer
