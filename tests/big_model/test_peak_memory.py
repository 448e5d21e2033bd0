"""A GPT-2 twice the CPU budget, loaded from shards with the rest on disk, in a fresh
process: the plain model's logits, and a peak resident set (from the moment the empty model
is built) under the budget plus a margin of one shard, one block and 16 MiB (allocator and
activations)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from .models import build, logits, saved

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20
SHARD = 8 * MiB

_LOAD = """
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
from tests.big_model.models import empty, gpt2_config, logits
from notebook_accel.big_modeling import load_checkpoint_and_dispatch
from notebook_accel.utils import compute_module_sizes

folder = Path(sys.argv[1])
config = gpt2_config(layers=8, width=384)
model = empty("gpt2", config)
size = compute_module_sizes(model)[""]
budget = size // 2


def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024


with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # the peak (VmHWM) starts again from now
before = rss("VmRSS:")
model = load_checkpoint_and_dispatch(
    model, folder / "ckpt", device_map="auto", max_memory={"cpu": budget},
    no_split_module_classes=["GPT2Block"], offload_folder=folder / "offload",
)
tokens = torch.arange(16).reshape(2, 8) % 64
out = logits(model, tokens)
peak = rss("VmHWM:")
save_file({"logits": out.contiguous()}, str(folder / "logits.safetensors"))
places = sorted({str(v) for v in model.hf_device_map.values()})
print(json.dumps({"size": size, "budget": budget, "before": before, "peak": peak,
                  "places": places}))
"""


def test_twice_the_budget_loads_with_disk_offload_under_the_budget(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    config, folder = saved(
        "gpt2", tmp_path / "ckpt", shard=f"{SHARD // 10**6}MB", layers=8, width=384
    )
    model = build("gpt2", config)
    model.load_state_dict(load_file_all(folder), strict=False)
    model.tie_weights()
    expected = logits(model, torch.arange(16).reshape(2, 8) % 64)
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["places"] == ["cpu", "disk"]
    got = load_file(tmp_path / "logits.safetensors")["logits"]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    block = figures["size"] // 8
    margin = SHARD + block + 16 * MiB
    grown = figures["peak"] - figures["before"]
    report = f"peak grew {grown / MiB:.1f} MiB; budget {figures['budget'] / MiB:.1f} MiB"
    print(report, f"(model {figures['size'] / MiB:.1f} MiB, margin {margin / MiB:.1f} MiB)")
    assert grown <= figures["budget"] + margin, report


def load_file_all(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update(load_file(path))
    return state
