"""accelerate's own examples, run unchanged on accelerate and on notebook_accel, side by side.

For each example of accelerate's ``examples/`` folder (``--examples DIR``; a checkout of
accelerate's repository, or ``git archive HEAD examples`` of it), two fresh Python processes:

- as is, on the installed accelerate;
- with every ``accelerate`` / ``accelerate.X`` import rewritten to ``notebook_accel`` /
  ``notebook_accel.X``, nothing else in the text changed.

Each runs ``notebook_launcher(training_function, (config, args), num_processes=2,
mixed_precision="no")`` of its framework on CPU, ``(config, args)`` from the script's own
``main()``/argparse (defaults, ``--cpu``, and what the example needs: see ``EXAMPLES``).
What the examples fetch from the Hub is stood in for offline (``hub_standins/``: a synthetic
GLUE MRPC / wikitext, a word-level tokenizer, tiny BERT / GPT-2 built from configs under a
fixed seed, the exact glue/mrpc metric), installed by a ``sitecustomize`` on the run's
PYTHONPATH, so the examples' workers get them too. The network is off (HF_HUB_OFFLINE=1).

Each run is timed end to end, from its process's start to its exit (the table's last two
columns), as ``python train.py`` would be: the harness's ``__main__`` is a file.

From each run's output: the per-epoch lines the examples print (``epoch N: {...}``; the
autoregressive example's every update step: loss and grad norm), TensorBoard's ``train_loss``
where the example logs it, and a hash of the final weights (printed at ``end_training`` by
the stand-ins). Verdict per example: ``same`` (accuracy/F1 within 1e-6, losses within 1e-4
relative, weights equal), ``differs``, or ``fails (<side>: <error line>)``. The checkpointing
example also runs resumed from its epoch-0 checkpoint (its note says whether each framework
resumes to its own uninterrupted run), and the DeepSpeed example once more with DeepSpeed on
(accelerate's ZeRO-2 template, fp16 off).

End to end, 2026-12-04 (this 2-core machine, load 0.4-2.4: tests ran beside), seconds,
accelerate / ours. Before forkserver.renew, our workers came from a fresh forkserver and
imported the example's libraries again (transformers, datasets, evaluate): nlp_example 7.5 /
10.5, complete_nlp_example 11.0 / 13.4, checkpointing 6.8 / 9.4, ddp_comm_hook 7.3 / 9.1,
early_stopping 8.1 / 9.0, memory 7.2 / 9.7, multi_process_metrics 7.1 / 13.7, schedule_free
10.6 / 13.3 (on 2026-12-03, with a ``python -c`` harness: up to 9 / 29). After (the launch
forks the script, as accelerate's fork launcher does): ours within accelerate's + 1 s on all
17 examples and at or under it on 15 (checkpointing 7.0 / 7.4, deepspeed 10.0 / 10.3;
complete_nlp_example 11.7 / 9.4, memory 8.2 / 5.5), the same numbers on both sides.

Run: ``python benchmarks/accelerate_examples.py --examples /path/to/accelerate/examples
[--only nlp_example,checkpointing] [--out table.md]`` (needs ``.[bench]``: accelerate,
transformers, datasets, evaluate, scikit-learn, schedulefree). Full outputs stay in
``--work`` (default: a temporary folder, kept).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STANDINS = Path(__file__).resolve().parent / "hub_standins"

# name -> (path under examples/, the example's arguments; "{work}" is the run's folder)
EXAMPLES: dict[str, tuple[str, list[str]]] = {
    "nlp_example": ("nlp_example.py", []),
    "complete_nlp_example": (
        "complete_nlp_example.py",
        ["--with_tracking", "--project_dir", "{work}/logs", "--output_dir", "{work}/out"],
    ),
    "checkpointing": (
        "by_feature/checkpointing.py",
        ["--checkpointing_steps", "epoch", "--output_dir", "{work}/ckpt"],
    ),
    "cross_validation": ("by_feature/cross_validation.py", ["--num_folds", "2"]),
    "ddp_comm_hook": ("by_feature/ddp_comm_hook.py", []),
    "early_stopping": ("by_feature/early_stopping.py", []),
    "gradient_accumulation": ("by_feature/gradient_accumulation.py", []),
    "gradient_accumulation_for_autoregressive_models": (
        "by_feature/gradient_accumulation_for_autoregressive_models.py",
        [],
    ),
    "automatic_gradient_accumulation": ("by_feature/automatic_gradient_accumulation.py", []),
    "local_sgd": ("by_feature/local_sgd.py", []),
    "memory": ("by_feature/memory.py", []),
    "multi_process_metrics": ("by_feature/multi_process_metrics.py", []),
    "profiler": ("by_feature/profiler.py", ["--output_trace_dir", "{work}/trace"]),
    "schedule_free": ("by_feature/schedule_free.py", []),
    "tracking": ("by_feature/tracking.py", ["--with_tracking", "--project_dir", "{work}/logs"]),
    "deepspeed_with_config_support": (
        "by_feature/deepspeed_with_config_support.py",
        [
            "--dataset_name",
            "wikitext",
            "--dataset_config_name",
            "wikitext-2-raw-v1",
            "--model_name_or_path",
            "gpt2",
            "--block_size",
            "32",
            "--seed",
            "42",
            "--per_device_train_batch_size",
            "2",
            "--per_device_eval_batch_size",
            "2",
            "--output_dir",
            "{work}/out",
        ],
    ),  # fmt: skip
    "fsdp_with_peak_mem_tracking": (
        "by_feature/fsdp_with_peak_mem_tracking.py",
        ["--model_name_or_path", "bert-base-cased", "--output_dir", "{work}/out"],
    ),
}
RESUMED = "checkpointing (resumed from epoch_0)"
# The DeepSpeed example once more with DeepSpeed on: accelerate's ZeRO-2 template, fp16 off
# (CPU, mixed_precision "no"); accelerate reads it from its environment variables, ours gets
# notebook_launcher(deepspeed={"hf_ds_config": file}).
ZERO2 = "deepspeed_with_config_support (ZeRO-2 config)"
ZERO2_TEMPLATE = "deepspeed_config_templates/zero_stage2_config.json"
ZERO2_ARGS = ["--num_warmup_steps", "2"]
FRAMEWORKS = ("accelerate", "ours")

_IMPORT = re.compile(r"^(\s*)(from|import)\s+accelerate\b", re.MULTILINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_FLOAT = r"(?:tensor\()?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan))"
_EPOCH = re.compile(r"\bepoch (\d+):\s*(\{.*\})\s*$")
_STEP = re.compile(
    rf"\bepoch (\d+) - update step (\d+):: grad norm: {_FLOAT}\S* ::train loss: {_FLOAT}"
)
_EVAL = re.compile(rf"\bepoch (\d+):?:? (?:eval )?perplexity: {_FLOAT}\S* eval_loss: {_FLOAT}")
_TEST = re.compile(r"Average test metrics from all folds:\s*(\{.*\})\s*$")
_WEIGHTS = re.compile(r"@@harness weights (\S+)")
_ERROR = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b:?.*)$")
_WRAPPERS = ("ChildFailedError", "ProcessRaisedException", "ProcessExitedException")


def rewrite(text: str) -> str:
    """Every ``accelerate`` / ``accelerate.X`` import names ``notebook_accel`` instead."""
    return _IMPORT.sub(lambda m: f"{m.group(1)}{m.group(2)} notebook_accel", text)


@dataclass
class Run:
    """One example on one framework: what it printed, parsed."""

    returncode: int | None  # None: timed out
    seconds: float
    metrics: list[tuple[str, dict[str, float]]] = field(default_factory=list)
    weights: str | None = None
    error: str | None = None
    folder: str = ""


def _numbers(mapping: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in mapping.items() if isinstance(v, int | float)}


def parse_output(text: str) -> tuple[list[tuple[str, dict[str, float]]], str | None]:
    """The metric lines an example printed, in order, and the weights hash."""
    metrics: list[tuple[str, dict[str, float]]] = []
    weights = None
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        if m := _STEP.search(line):
            label = f"epoch {m[1]} step {m[2]}"
            metrics.append((label, {"grad_norm": float(m[3]), "train_loss": float(m[4])}))
        elif m := _EVAL.search(line):
            metrics.append((f"epoch {m[1]}", {"perplexity": float(m[2]), "eval_loss": float(m[3])}))
        elif m := _EPOCH.search(line):
            try:
                metrics.append((f"epoch {m[1]}", _numbers(ast.literal_eval(m[2]))))
            except (ValueError, SyntaxError):
                continue
        elif m := _TEST.search(line):
            metrics.append(("test (folds averaged)", _numbers(ast.literal_eval(m[1]))))
        elif m := _WEIGHTS.search(line):
            weights = m[1]
    # A line logged through two handlers (the DeepSpeed example's logger) counts once.
    metrics = [entry for i, entry in enumerate(metrics) if i == 0 or entry != metrics[i - 1]]
    return metrics, weights


def error_line(text: str) -> str:
    """The exception a failed run died of: the first one that is not a launcher's wrapper."""
    found = []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).strip()
        if line.startswith(("File ", "Traceback", "raise ", "~", "^")):
            continue
        if (m := _ERROR.search(line)) and not m[1].startswith("@@"):
            found.append(m[1])
    keep = [line for line in found if not any(w in line.split(":")[0] for w in _WRAPPERS)]
    keep = [line for line in keep if ":" in line]
    pick = keep[0] if keep else (found[-1] if found else "")
    if not pick:
        lines = [line for line in text.splitlines() if line.strip()]
        pick = lines[-1].strip() if lines else "no output"
    return pick[:200]


def tensorboard_losses(folder: Path) -> list[tuple[str, dict[str, float]]]:
    """``train_loss`` scalars from the TensorBoard files the run wrote, by step."""
    events = sorted(folder.rglob("events.out.tfevents.*"))
    if not events:
        return []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: list[tuple[str, dict[str, float]]] = []
    for path in events:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        if "train_loss" in accumulator.Tags().get("scalars", []):
            for event in accumulator.Scalars("train_loss"):
                found.append((f"tensorboard step {event.step}", {"train_loss": event.value}))
    return found


def _environment(scripts: Path, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "NOTEBOOK_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(STANDINS), str(scripts), str(ROOT)]),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_EVALUATE_OFFLINE="1",
        HF_HOME=str(work / "hf"),
        XDG_CONFIG_HOME=str(work / "config"),
        WANDB_MODE="offline",
        WANDB_DIR=str(work),
        MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}",
        TRACKIO_DIR=str(work / "trackio"),
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    return env


def _launch(
    command: list[str], work: Path, env: dict[str, str], timeout: float
) -> tuple[int | None, float]:
    """The run's exit code (None: timed out) and seconds; its output in work/std*.txt."""
    start = time.perf_counter()
    with open(work / "stdout.txt", "w") as out, open(work / "stderr.txt", "w") as err:
        try:
            code: int | None = subprocess.run(
                command, cwd=work, env=env, stdout=out, stderr=err, timeout=timeout, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    return code, time.perf_counter() - start


def run_one(
    examples: Path,
    name: str,
    framework: str,
    work: Path,
    argv: list[str],
    timeout: float,
    config: dict[str, Any] | None = None,
    reuse: bool = False,
) -> Run:
    """Run one example on one framework in a fresh process; parse what it printed.

    With ``reuse``, a run already recorded in ``work`` (run.json) is parsed again, not rerun.
    """
    relative = EXAMPLES[name.split(" ")[0]][0]
    env = _environment(work / "scripts", work)
    deepspeed: list[str] = []
    if framework == "accelerate" and name == "deepspeed_with_config_support":
        # Its Accelerator() has no cpu= (nor a --cpu option): without ACCELERATE_USE_CPU,
        # accelerate's notebook_launcher on a CPU machine starts 2 processes that each train
        # alone (its log: "Total train batch size = 2", twice). Ours needs no such variable.
        # Not for the ZeRO-2 row: with it, accelerate leaves DeepSpeed off (plain DDP).
        env["ACCELERATE_USE_CPU"] = "yes"
    if name == ZERO2:
        settings = json.loads((examples / ZERO2_TEMPLATE).read_text())
        settings["fp16"]["enabled"] = False
        (work / "zero2_cpu.json").write_text(json.dumps(settings, indent=1))
        deepspeed = ["--deepspeed", str(work / "zero2_cpu.json")]
        if framework == "accelerate":
            env.update(
                ACCELERATE_USE_DEEPSPEED="true",
                ACCELERATE_DEEPSPEED_CONFIG_FILE=str(work / "zero2_cpu.json"),
            )
    text = (examples / relative).read_text()
    scripts = work / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    module = Path(relative).stem
    (scripts / f"{module}.py").write_text(text if framework == "accelerate" else rewrite(text))
    argv = [arg.replace("{work}", str(work)) for arg in argv]
    command = [
        sys.executable,
        str(STANDINS / "run_example.py"),  # __main__ is a file, as in `python train.py`
        "--framework",
        framework,
        "--module",
        module,
        "--argv",
        json.dumps(argv),
        "--config",
        json.dumps(config or {}),
        *deepspeed,
    ]
    record = work / "run.json"
    if reuse and record.is_file():
        code, seconds = json.loads(record.read_text())
    else:
        code, seconds = _launch(command, work, env, timeout)
        record.write_text(json.dumps([code, seconds]))
    output = (work / "stdout.txt").read_text() + "\n" + (work / "stderr.txt").read_text()
    metrics, weights = parse_output(output)
    metrics += tensorboard_losses(work)
    run = Run(code, seconds, metrics, weights, folder=str(work))
    if code is None:
        run.error = f"timed out after {timeout:.0f} s"
    elif code != 0 or "@@harness done" not in output:
        run.error = error_line((work / "stderr.txt").read_text() or output)
    return run


def _close(key: str, a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if "accuracy" in key or "f1" in key:
        return abs(a - b) <= 1e-6
    return abs(a - b) <= 1e-4 * max(abs(a), abs(b)) or a == b


def compare_metrics(
    ref: list[tuple[str, dict[str, float]]], ours: list[tuple[str, dict[str, float]]]
) -> str | None:
    """None when both runs printed the same metrics within tolerance, else the first gap."""
    if not ref and not ours:
        return "no metrics printed"
    if [label for label, _ in ref] != [label for label, _ in ours]:
        return f"{len(ref)} metric lines vs {len(ours)}"
    for (label, a), (_, b) in zip(ref, ours, strict=True):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{label}: {key} only on one side"
            if not _close(key, a[key], b[key]):
                return f"{label}: {key} {a[key]:.6g} vs {b[key]:.6g}"
    return None


def verdict(ref: Run, ours: Run) -> str:
    """same / differs (first gap) / fails (side: error)."""
    failures = [f"{side}: {run.error}" for side, run in (("accelerate", ref), ("ours", ours))]
    failures = [f for f, run in zip(failures, (ref, ours), strict=True) if run.error]
    if failures:
        return "fails (" + "; ".join(failures) + ")"
    gap = compare_metrics(ref.metrics, ours.metrics)
    if gap:
        return f"differs ({gap})"
    if ref.weights is None or ours.weights is None or "unavailable" in (ref.weights + ours.weights):
        return "same metrics (no weights hash)"
    if ref.weights != ours.weights:
        return "differs (weights)"
    return "same"


def summary(run: Run) -> str:
    """A table cell: each metric line (per-step lines summarised), and the weights hash."""
    steps = [m for label, m in run.metrics if label.startswith("epoch ") and " step " in label]
    board = [m["train_loss"] for label, m in run.metrics if label.startswith("tensorboard")]
    parts = [
        f"{label}: " + ", ".join(f"{k} {v:.5g}" for k, v in m.items())
        for label, m in run.metrics
        if label.startswith(("epoch ", "test ")) and " step " not in label
    ]
    if steps:
        last = ", ".join(f"{k} {v:.6g}" for k, v in steps[-1].items())
        parts.insert(0, f"{len(steps)} update steps, the last: {last}")
    if board:
        parts.append("TensorBoard train_loss " + ", ".join(f"{v:.6g}" for v in board))
    if run.weights:
        parts.append(f"weights {run.weights}")
    if run.error and not run.metrics:
        parts.append("(no metrics)")
    return "; ".join(parts) or "-"


def resume_note(runs: dict[str, dict[str, Run]]) -> str:
    """Does each framework's resumed run reach its own uninterrupted run's numbers?"""
    notes = []
    for framework in FRAMEWORKS:
        full, resumed = runs["checkpointing"][framework], runs[RESUMED][framework]
        if full.error or resumed.error:
            notes.append(f"{framework}: n/a")
            continue
        tail = [(label, m) for label, m in full.metrics if label != "epoch 0"]
        own = compare_metrics(tail, resumed.metrics) is None and full.weights == resumed.weights
        notes.append(f"{framework} resumes to its uninterrupted run: {'yes' if own else 'no'}")
    return "; ".join(notes)


def table(runs: dict[str, dict[str, Run]]) -> str:
    lines = [
        "| example | accelerate per-epoch metrics | ours | verdict | seconds: accelerate | ours |",
        "|---|---|---|---|---|---|",
    ]
    for name, pair in runs.items():
        ref, ours = pair["accelerate"], pair["ours"]
        cell = verdict(ref, ours)
        if name == RESUMED and "checkpointing" in runs:
            cell += f" [{resume_note(runs)}]"
        row = [name, summary(ref), summary(ours), cell, _seconds(ref), _seconds(ours)]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in row) + " |")
    return "\n".join(lines)


def _seconds(run: Run) -> str:
    """The run's end-to-end time (process start to exit), and whether it exited by itself."""
    return f"{run.seconds:.1f}" + (" (stopped: hung)" if run.returncode is None else "")


def _plan(only: list[str]) -> list[tuple[str, list[str]]]:
    names = only or list(EXAMPLES)
    unknown = [n for n in names if n not in EXAMPLES]
    if unknown:
        raise SystemExit(f"--only: unknown example(s) {unknown}; accepted: {', '.join(EXAMPLES)}")
    plan = [(name, EXAMPLES[name][1]) for name in names]
    if "checkpointing" in names:
        resumed = ["--checkpointing_steps", "epoch", "--output_dir", "{work}/ckpt"]
        plan.append((RESUMED, [*resumed, "--resume_from_checkpoint", "{first}/ckpt/epoch_0"]))
    if "deepspeed_with_config_support" in names:
        # DeepSpeed's WarmupDecayLR refuses the example's default of 0 warmup steps.
        plan.append((ZERO2, [*EXAMPLES["deepspeed_with_config_support"][1], *ZERO2_ARGS]))
    return plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=Path, required=True, help="accelerate's examples/")
    parser.add_argument("--only", default="", help="comma-separated example names")
    parser.add_argument("--out", type=Path, help="write the table here (markdown)")
    parser.add_argument("--work", type=Path, help="folder for the runs (default: a temp one)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="replace an entry of the config dict the example's main() builds, on both sides "
        "(e.g. lr=1e-3: the examples' own lr barely moves a tiny model); off by default",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="parse the runs already in --work again instead of rerunning them (missing ones run)",
    )
    options = parser.parse_args()
    config = {}
    for item in options.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. lr=1e-3")
        try:
            config[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            config[key] = value
    if not (options.examples / "nlp_example.py").is_file():
        raise SystemExit(f"--examples {options.examples}: no nlp_example.py there")
    only = [n.strip() for n in options.only.split(",") if n.strip()]
    work = options.work or Path(tempfile.mkdtemp(prefix="accelerate_examples_"))
    runs: dict[str, dict[str, Run]] = {}
    for name, argv in _plan(only):
        runs[name] = {}
        for framework in FRAMEWORKS:
            slug = re.sub(r"\W+", "_", name).strip("_")
            folder = work / slug / framework
            folder.mkdir(parents=True, exist_ok=True)
            first = work / "checkpointing" / framework
            args = [a.replace("{first}", str(first)) for a in argv]
            run = run_one(
                options.examples, name, framework, folder, args, options.timeout, config,
                options.reuse,
            )  # fmt: skip
            runs[name][framework] = run
            status = run.error or f"{len(run.metrics)} metric lines, weights {run.weights}"
            print(f"{name} [{framework}] {run.seconds:.0f} s: {status}", flush=True)
    rendered = table(runs)
    if config:
        rendered = f"Config entries replaced on both sides: {config}\n\n{rendered}"
    print(rendered)
    raw = {n: {f: vars(r) for f, r in pair.items()} for n, pair in runs.items()}
    (work / "results.json").write_text(json.dumps(raw, indent=1))
    if options.out:
        options.out.write_text(rendered + "\n")
    print(f"outputs in {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
