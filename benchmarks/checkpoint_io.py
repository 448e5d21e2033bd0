"""save_state / load_state time: HF accelerate vs notebook_accel, same model, same files.

Both write accelerate's layout (model.safetensors, optimizer.bin, random_states_N.pkl); ours
adds the staging folder and rename (atomicity), and reads with ``weights_only=True``. Each
variant runs on 2 CPU processes (gloo) in its own launch; every save and load is followed by
``wait_for_everyone`` so the time is the job's, not only the fastest rank's. Variants are
interleaved over ``--rounds`` launches (order rotated); the median per round is kept and the
median over rounds shown.

Run: ``python benchmarks/checkpoint_io.py`` (needs ``pip install accelerate``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from notebook_accel import debug_launcher


def _setup(hidden: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.set_num_threads(1)  # 2 processes on a 2-core machine
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _measure(acc: Any, cfg: dict[str, Any]) -> dict[str, list[float]]:
    model, opt = acc.prepare(*_setup(cfg["hidden"]))
    acc.backward(model(torch.randn(8, 256)).sum())
    opt.step()  # Adam's state exists
    save, load = [], []
    for i in range(cfg["repeats"]):
        folder = str(Path(cfg["root"]) / f"{cfg['name']}_{i % 2}")
        acc.wait_for_everyone()
        start = time.perf_counter()
        acc.save_state(folder)
        acc.wait_for_everyone()
        save.append(time.perf_counter() - start)
        start = time.perf_counter()
        acc.load_state(folder)
        acc.wait_for_everyone()
        load.append(time.perf_counter() - start)
    return {"save": save, "load": load}


def ours(cfg: dict[str, Any]) -> dict[str, list[float]]:
    from notebook_accel import Accelerator

    return _measure(Accelerator(cpu=True), cfg)


def theirs(cfg: dict[str, Any]) -> dict[str, list[float]]:
    import warnings

    warnings.simplefilter("ignore")  # accelerate's OMP_NUM_THREADS notice
    from accelerate import Accelerator

    result = _measure(Accelerator(cpu=True), cfg)
    torch.distributed.destroy_process_group()
    return result


VARIANTS = {"accelerate": theirs, "notebook_accel": ours}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    names = list(VARIANTS)
    times: dict[str, dict[str, list[float]]] = {n: {"save": [], "load": []} for n in names}
    with tempfile.TemporaryDirectory() as root:
        for round_ in range(args.rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                cfg = {"hidden": args.hidden, "repeats": args.repeats, "root": root, "name": name}
                ranks = debug_launcher(VARIANTS[name], args=(cfg,), num_processes=2, output="none")
                for what in ("save", "load"):
                    times[name][what].append(statistics.median(ranks[0][what]) * 1e3)
    params = sum(p.numel() for p in _setup(args.hidden)[0].parameters())
    print(f"model: {params / 1e6:.1f} M parameters (+ Adam state); 2 CPU processes")
    print(f"{'':<16}{'save_state ms':>16}{'load_state ms':>16}")
    base = {w: statistics.median(times["accelerate"][w]) for w in ("save", "load")}
    for name in names:
        save, load = (statistics.median(times[name][w]) for w in ("save", "load"))
        ratios = save / base["save"], load / base["load"]
        print(f"{name:<16}{save:>10.1f} {ratios[0]:.2f}x{load:>10.1f} {ratios[1]:.2f}x")
    print(
        "per-round medians (ms):",
        {n: {w: [round(v, 1) for v in vs] for w, vs in t.items()} for n, t in times.items()},
    )


if __name__ == "__main__":
    main()
