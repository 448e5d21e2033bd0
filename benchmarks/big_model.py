"""A disk-offloaded forward pass: notebook_accel vs HF accelerate on the same load.

One GPT-2 checkpoint (save_pretrained's shards and index), one ``max_memory`` CPU budget of
half the model, ``device_map="auto"`` with the rest offloaded to disk: each library loads it
into its own empty model (``init_empty_weights``) in a fresh process, then times forward
passes (median of ``--repeats`` after one warm-up). Rounds alternate which library goes
first; the median over rounds is shown, with each process's peak RSS above the empty model.

Run: ``python benchmarks/big_model.py`` (needs ``pip install accelerate transformers``).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _config(layers: int, width: int) -> Any:
    from transformers import GPT2Config

    return GPT2Config(vocab_size=1024, n_positions=256, n_embd=width, n_layer=layers, n_head=8)


def _save(folder: Path, layers: int, width: int) -> None:
    import torch
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(_config(layers, width)).save_pretrained(folder, max_shard_size="20MB")


def _libraries(name: str) -> tuple[Any, Any, Any]:
    if name == "ours":
        from notebook_accel.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
        from notebook_accel.utils import compute_module_sizes
    else:
        from accelerate import init_empty_weights, load_checkpoint_and_dispatch
        from accelerate.utils import compute_module_sizes
    return init_empty_weights, load_checkpoint_and_dispatch, compute_module_sizes


def child(name: str, folder: Path, layers: int, width: int, repeats: int) -> dict[str, Any]:
    """In a fresh process: load with one library, then time its forward passes."""
    import torch
    from transformers import GPT2LMHeadModel

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _measure import peak_since, reset_peak

    torch.set_num_threads(1)
    init_empty_weights, load_and_dispatch, sizes = _libraries(name)
    with init_empty_weights():
        model = GPT2LMHeadModel(_config(layers, width)).eval()
    model.tie_weights()
    budget = sizes(model)[""] // 2
    base = reset_peak()
    start = time.perf_counter()
    model = load_and_dispatch(
        model,
        folder / "ckpt",
        device_map="auto",
        max_memory={"cpu": budget},
        no_split_module_classes=["GPT2Block"],
        offload_folder=folder / f"offload-{name}",
    )
    load = time.perf_counter() - start
    tokens = torch.arange(256).reshape(2, 128) % 1024
    times = []
    with torch.no_grad():
        out = model(input_ids=tokens).logits
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(repeats):
            start = time.perf_counter()
            model(input_ids=tokens)
            times.append(time.perf_counter() - start)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    places = sorted({str(v) for v in model.hf_device_map.values()})
    return {
        "forward_ms": statistics.median(times) * 1e3,
        "load_s": load,
        "peak_mib": peak_since(base) / 1024,
        "faults_k": faults / repeats / 1000,
        "budget_mib": budget / 2**20,
        "places": places,
        "checksum": float(out.double().abs().sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["ours", "accelerate"])
    parser.add_argument("--folder", type=Path)
    args = parser.parse_args()
    if args.child:
        result = child(args.child, args.folder, args.layers, args.width, args.repeats)
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _save(folder / "ckpt", args.layers, args.width)
        found: dict[str, list[dict[str, Any]]] = {"ours": [], "accelerate": []}
        for round_ in range(args.rounds):
            order = ["ours", "accelerate"][:: 1 if round_ % 2 == 0 else -1]
            for name in order:
                command = [sys.executable, __file__, "--child", name, "--folder", str(folder)]
                command += ["--layers", str(args.layers), "--width", str(args.width)]
                command += ["--repeats", str(args.repeats)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                found[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    _report(found)


def _report(found: dict[str, list[dict[str, Any]]]) -> None:
    ours, theirs = found["ours"], found["accelerate"]
    first = ours[0]
    budget = first["budget_mib"]
    print(f"GPT-2, CPU budget {budget:.0f} MiB (half the model), places {first['places']}")
    print(f"{'':24}{'notebook_accel':>16}{'accelerate':>14}{'ratio':>8}")
    for key, label in [("forward_ms", "forward (ms, median)"), ("load_s", "load (s)"),
                       ("peak_mib", "peak RSS (MiB)"),
                       ("faults_k", "page faults/forward (k)")]:  # fmt: skip
        a = statistics.median(r[key] for r in ours)
        b = statistics.median(r[key] for r in theirs)
        print(f"{label:24}{a:16.1f}{b:14.1f}{a / b:8.2f}")
    same = {r["checksum"] for r in ours} == {r["checksum"] for r in theirs}
    print(f"same logits (checksum): {same}")


if __name__ == "__main__":
    main()
