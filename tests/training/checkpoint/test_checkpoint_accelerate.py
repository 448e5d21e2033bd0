"""Checkpoints exchanged with HF accelerate: each library loads the other's save_state folder.

accelerate runs in a subprocess (its Accelerator is a process-wide singleton), or in our
launcher's workers for its multi-process (DDP) layout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from notebook_accel import debug_launcher

pytest.importorskip("accelerate")

# The same training on both sides: two models (model.safetensors and model_1.safetensors), Adam
# and a StepLR, three steps; then the next random draws, which a restored RNG must repeat.
COMMON = textwrap.dedent(
    """
    import random

    import numpy as np
    import torch


    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
        )
        head = torch.nn.Linear(2, 2)
        opt = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return model, head, opt, sched


    def train(acc, model, head, opt, sched, steps=3):
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            x = torch.randn(4, 6, generator=g)
            with acc.accumulate(model):  # accelerate counts its step here
                acc.backward(head(model(x)).pow(2).mean())
                opt.step()
                sched.step()
                opt.zero_grad()


    def snapshot(acc, model, head, opt, sched):
        return {
            "model": {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()},
            "head": {k: v.clone() for k, v in acc.unwrap_model(head).state_dict().items()},
            "opt": opt.state_dict()["state"],
            "lr": sched.get_last_lr(),
            "step": acc.step,
        }


    def draws():
        return {
            "torch": torch.rand(3).tolist(),
            "numpy": np.random.rand(3).tolist(),
            "python": [random.random() for _ in range(3)],
        }
    """
)

ACCELERATE_SAVES = COMMON + textwrap.dedent(
    """
    import sys
    from accelerate import Accelerator

    folder, export, out = sys.argv[1:4]
    acc = Accelerator(cpu=True)
    model, head, opt, sched = acc.prepare(*build())
    train(acc, model, head, opt, sched)
    acc.save_state(folder)
    acc.save_model(model, export, max_shard_size="0.0003MB")
    result = snapshot(acc, model, head, opt, sched)
    result["draws"] = draws()
    torch.save(result, out)
    """
)

ACCELERATE_LOADS = COMMON + textwrap.dedent(
    """
    import sys
    from accelerate import Accelerator

    folder, out = sys.argv[1:3]
    acc = Accelerator(cpu=True)
    model, head, opt, sched = acc.prepare(*build())
    acc.load_state(folder)
    result = snapshot(acc, model, head, opt, sched)
    result["draws"] = draws()
    torch.save(result, out)
    """
)


def _common() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(COMMON, namespace)
    return namespace


def _run(script: str, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for part in ("model", "head"):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            torch.testing.assert_close(a[part][key], b[part][key], rtol=0, atol=0)
    assert a["opt"].keys() == b["opt"].keys()
    for index in a["opt"]:
        for name, value in a["opt"][index].items():
            torch.testing.assert_close(value, b["opt"][index][name], rtol=0, atol=0)
    assert a["lr"] == b["lr"]
    assert a["step"] == b["step"] == 3


def test_we_load_a_checkpoint_accelerate_wrote(tmp_path: Path) -> None:
    from notebook_accel import Accelerator

    out = tmp_path / "accelerate.pt"
    _run(ACCELERATE_SAVES, str(tmp_path / "ckpt"), str(tmp_path / "export"), str(out))
    theirs = torch.load(out, weights_only=True)
    names = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {"model.safetensors", "model_1.safetensors", "optimizer.bin"} <= names

    ns = _common()
    acc = Accelerator(cpu=True)
    model, head, opt, sched = acc.prepare(*ns["build"]())
    with torch.no_grad():
        for p in list(model.parameters()) + list(head.parameters()):
            p.zero_()  # the load must overwrite
    acc.load_state(tmp_path / "ckpt")
    _same(ns["snapshot"](acc, model, head, opt, sched), theirs)
    assert ns["draws"]() == theirs["draws"]  # accelerate's random_states_0.pkl restored
    # Training goes on from there exactly as it would have.
    ns["train"](acc, model, head, opt, sched, steps=1)

    # save_model: the same files (sharded at 300 bytes), index and tensors as accelerate's.
    theirs_files = sorted(p.name for p in (tmp_path / "export").iterdir())
    fresh = Accelerator(cpu=True)
    exported, *_ = fresh.prepare(*ns["build"]())
    fresh.load_state(tmp_path / "ckpt")
    ours = fresh.save_model(exported, tmp_path / "ours", max_shard_size="0.0003MB")
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == theirs_files
    assert ours.name == "model.safetensors.index.json"
    index = json.loads(ours.read_text())
    reference = json.loads((tmp_path / "export" / ours.name).read_text())
    assert index == reference
    from safetensors.torch import load_file

    for name in theirs_files:
        if name.endswith(".safetensors"):
            a, b = load_file(tmp_path / "ours" / name), load_file(tmp_path / "export" / name)
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_accelerate_loads_a_checkpoint_we_wrote(tmp_path: Path) -> None:
    from notebook_accel import Accelerator

    ns = _common()
    acc = Accelerator(cpu=True)
    model, head, opt, sched = acc.prepare(*ns["build"]())
    ns["train"](acc, model, head, opt, sched)
    acc.save_state(tmp_path / "ckpt")
    ours = ns["snapshot"](acc, model, head, opt, sched)
    ours["draws"] = ns["draws"]()

    out = tmp_path / "accelerate.pt"
    _run(ACCELERATE_LOADS, str(tmp_path / "ckpt"), str(out))
    theirs = torch.load(out, weights_only=True)
    _same(theirs, ours)
    assert theirs["draws"] == ours["draws"]


def _accelerate_on_two(folder: str) -> dict[str, Any]:
    from accelerate import Accelerator as TheirAccelerator

    ns = _common()
    acc = TheirAccelerator(cpu=True)
    model, head, opt, sched = acc.prepare(*ns["build"]())
    ns["train"](acc, model, head, opt, sched)
    acc.save_state(folder)
    result = ns["snapshot"](acc, model, head, opt, sched)
    result["draws"] = ns["draws"]()
    acc.wait_for_everyone()
    torch.distributed.destroy_process_group()
    return result


def _ours_on_two(folder: str) -> dict[str, Any]:
    from notebook_accel import Accelerator

    ns = _common()
    acc = Accelerator(cpu=True)
    model, head, opt, sched = acc.prepare(*ns["build"]())
    acc.load_state(folder)
    result = ns["snapshot"](acc, model, head, opt, sched)
    result["draws"] = ns["draws"]()
    return result


@pytest.mark.slow
def test_we_load_accelerates_two_process_checkpoint(tmp_path: Path) -> None:
    folder = str(tmp_path / "ckpt")
    theirs = debug_launcher(_accelerate_on_two, args=(folder,), num_processes=2)
    # Under DDP too, accelerate writes the unwrapped module's names, as we do.
    from safetensors.torch import load_file

    names = set(load_file(Path(folder) / "model.safetensors"))
    assert names == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert sorted(p.name for p in Path(folder).glob("random_states_*")) == [
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]
    ours = debug_launcher(_ours_on_two, args=(folder,), num_processes=2)
    for rank in range(2):
        _same(ours[rank], theirs[rank])
        assert ours[rank]["draws"] == theirs[rank]["draws"]  # random_states_<rank>.pkl


def test_the_file_name_constants_are_accelerates_and_save_state_uses_them(
    tmp_path: Path,
) -> None:
    accelerate_utils = pytest.importorskip("accelerate.utils")
    import notebook_accel.utils
    from notebook_accel import Accelerator
    from notebook_accel.training.checkpoint.files import FILE_NAMES

    for name in (*FILE_NAMES, "PROFILE_PATTERN_NAME"):
        assert getattr(notebook_accel.utils, name) == getattr(accelerate_utils, name), name
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    acc.save_state(str(tmp_path / "ckpt"))
    names = {p.name for p in (tmp_path / "ckpt").iterdir()}
    u = notebook_accel.utils
    assert {u.SAFE_WEIGHTS_NAME, f"{u.OPTIMIZER_NAME}.bin", f"{u.RNG_STATE_NAME}_0.pkl"} <= names
