"""What a launch leaves in its cell: ours, ours at another commit, accelerate's notebook_launcher.

The same functions (tests/tiny_models.py: tiny models built from configs, a tokenizer built
there, synthetic data; offline), launched on 2 CPU processes from a real Jupyter kernel
(nbclient, this interpreter), one fresh kernel per launch, as a Colab or Kaggle user has it:
``tqdm.auto`` and ``datasets`` imported first, then the launcher; only the launcher's import
line differs between the columns.

    nothing            a function that returns None: the launch's own cost and cell
    accelerator loop   accelerate's Accelerator (bf16, accumulation 2) under a tqdm.auto bar,
                       the loop of Hugging Face's simple_nlp_example notebook
    Trainer            transformers' Trainer, tiny BERT (2 epochs of 8 steps, a row every 2)
    SFTTrainer + LoRA  TRL's SFTTrainer with a PEFT LoRA on a tiny Llama

For each, from the launching cell as nbclient returns it: ``bytes`` (len(json.dumps(outputs)):
what a saved notebook keeps), ``fork`` (kernel messages dumped by a forked worker: jupyter_client's
"attempted to send message from fork"), ``reprs`` (printed ``<IPython.core.display...>``
objects), ``tables`` (HTML outputs holding a table: the Trainer's), ``bars`` (notebook bars) and
rank 0's number (its loss), which must be the same in every column; ``s``: the launching
cell's run (nbclient's timing: workers importing the libraries, training, the end), the
median of ``--launches`` launches in the same kernel (the first one's cell is measured).

    python benchmarks/rank_displays.py [--baseline DIR] [--only Trainer,...] [--launches N]

``--baseline DIR``: a checkout of another commit (``git archive <commit> | tar -x -C DIR``),
whose package the kernel imports instead of this one's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNS = {
    "nothing": "nothing",
    "accelerator loop": "accelerator_loop",
    "Trainer": "trainer_run",
    "SFTTrainer + LoRA": "sft_run",
}
# tests/ as a folder of modules: the functions travel as tiny_models.<name>, whichever
# checkout's package the kernel imports
SETUP = """\
import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import tqdm.auto
import datasets
import torch
from transformers import Trainer, TrainingArguments  # (a Trainer notebook's first cell)
sys.path.insert(0, {tests!r})
import tiny_models
{launcher}
"""
OURS = "from notebook_accel import notebook_launcher"
ACCELERATE = "from accelerate import notebook_launcher"


def _cells(function: str, launcher: str, folder: Path, port: int, launches: int) -> list[str]:
    extra = f", use_port={port}" if launcher == ACCELERATE else ""
    launch = (
        f"notebook_launcher(tiny_models.{function}, args=({str(folder)!r},), num_processes=2"
        f"{extra})"
    )
    return [SETUP.format(tests=str(ROOT / "tests"), launcher=launcher)] + [launch] * launches


def _seconds(cell: Any) -> float:
    """The cell's run, from nbclient's timing (execute_input to execute_reply)."""
    from datetime import datetime

    timing = cell.metadata["execution"]
    started = datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
    ended = datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
    return (ended - started).total_seconds()


def _measure(cell: Any, folder: Path) -> dict[str, Any]:
    outputs = cell.outputs
    text = json.dumps(outputs)
    printed = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    data = [o.get("data", {}) for o in outputs]
    try:
        number: Any = json.loads((folder / "0").read_text())
    except OSError:
        number = "-"
    errors = [o["ename"] for o in outputs if o["output_type"] == "error"]
    return {
        "bytes": len(text),
        "fork": text.count("attempted to send message from fork"),
        "reprs": printed.count("<IPython.core.display."),
        "tables": sum("<table" in d.get("text/html", "") for d in data),
        "bars": sum("application/vnd.jupyter.widget-view+json" in d for d in data),
        "number": number if not errors else f"error: {errors[0]}",
    }


def _launch(function: str, launcher: str, root: Path, work: Path, launches: int) -> dict[str, Any]:
    """``launches`` launches in a fresh kernel importing ``root``'s package: what the first
    one's cell holds; the median of their times."""
    from tests import kernelspec
    from tests.browser import free_port

    folder = Path(tempfile.mkdtemp(dir=work))
    with kernelspec.selected(Path(tempfile.mkdtemp(dir=work)), root):
        cells = kernelspec.run_cells(
            _cells(function, launcher, folder, free_port(), launches), timeout=lambda cell: 600
        )
    seconds = statistics.median(_seconds(cell) for cell in cells[1:])
    return {**_measure(cells[1], folder), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another checkout of notebook_accel")
    parser.add_argument("--only", help="comma-separated runs: " + ", ".join(RUNS))
    parser.add_argument("--launches", type=int, default=1, help="per kernel (time: median)")
    options = parser.parse_args()
    launchers = {"ours": (OURS, ROOT)}
    if options.baseline is not None:
        launchers["ours (baseline)"] = (OURS, options.baseline.resolve())
    launchers["accelerate"] = (ACCELERATE, ROOT)
    runs = options.only.split(",") if options.only else list(RUNS)
    work = Path(tempfile.mkdtemp(prefix="rank-displays-"))
    table = []
    for run in runs:
        for name, (launcher, root) in launchers.items():
            seen = _launch(RUNS[run], launcher, root, work, options.launches)
            table.append((run, name, seen))
            print(f"{run} / {name}: {seen}", flush=True)
    print()
    print("| run | launcher | bytes | fork | reprs | tables | bars | loss (rank 0) | s |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for run, name, seen in table:
        print(
            f"| {run} | {name} | {seen['bytes']} | {seen['fork']} | {seen['reprs']} | "
            f"{seen['tables']} | {seen['bars']} | {seen['number']} | {seen['seconds']:.1f} |"
        )


if __name__ == "__main__":
    main()
