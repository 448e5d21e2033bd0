"""The by_feature examples' names give accelerate's answers: one body, two imports.

The same function body runs on 2 gloo processes with ``accelerate``'s imports (1.16) and then
with ours (only the import lines differ): settable ``gradient_accumulation_steps``, LocalSGD,
a schedule-free optimizer's ``train()``/``eval()`` through ``prepare``, ``profile()``'s trace
files, ``get_logger``'s lines and the ``is_*_available`` probes must all agree, the trained
weights bit for bit.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from notebook_accel import debug_launcher

BODY = textwrap.dedent(
    """
    import logging
    import os

    import torch
    import torch.nn.functional as F
    import schedulefree
    from accelerate import Accelerator
    from accelerate.local_sgd import LocalSGD
    from accelerate.logging import get_logger
    from accelerate.utils import (
        ProfileKwargs,
        is_npu_available,
        is_schedulefree_available,
        is_xpu_available,
    )

    def model_and_batches(rank):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        g = torch.Generator().manual_seed(100 + rank)
        batches = [
            (torch.randn(4, 4, generator=g), torch.randn(4, 1, generator=g)) for _ in range(6)
        ]
        return model, batches

    def flat(model):
        return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()

    def main(folder):
        log_file = os.path.join(folder, "log.txt")
        logger = get_logger("port.names", log_level="INFO")
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.logger.addHandler(handler)
        logger.logger.propagate = False
        trace_dir = os.path.join(folder, "traces")
        acc = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(output_trace_dir=trace_dir)])
        r = {"probes": (is_xpu_available(), is_npu_available(), is_schedulefree_available())}

        # gradient_accumulation_steps set after construction
        model, batches = model_and_batches(acc.process_index)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = acc.prepare(model, opt)
        acc.gradient_accumulation_steps = 3
        synced = []
        for x, y in batches:
            with acc.accumulate(model):
                acc.backward(F.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()
                synced.append(acc.sync_gradients)
        r["accumulation"] = (acc.gradient_accumulation_steps, synced, flat(model))
        acc.gradient_accumulation_steps = 1

        # LocalSGD: averaged every 2 steps
        model, batches = model_and_batches(acc.process_index)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = acc.prepare(model, opt)
        trace = []
        with LocalSGD(accelerator=acc, model=model, local_sgd_steps=2, enabled=True) as sgd:
            for x, y in batches[:5]:
                with acc.accumulate(model):
                    acc.backward(F.mse_loss(model(x), y))
                    opt.step()
                    opt.zero_grad()
                    sgd.step()
                trace.append(flat(model))
        r["local_sgd"] = (trace, flat(model))

        # schedule-free through prepare
        model, batches = model_and_batches(acc.process_index)
        opt = schedulefree.AdamWScheduleFree(model.parameters(), lr=0.05, warmup_steps=2)
        model, opt = acc.prepare(model, opt)
        model.train()
        opt.train()
        for x, y in batches:
            acc.backward(F.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
        train_weights = flat(model)
        model.eval()
        opt.eval()
        r["schedule_free"] = (train_weights, flat(model))

        # profile(): a trace file per rank
        with acc.profile() as prof:
            model(batches[0][0]).sum()
        r["profiled"] = any(e.key == "aten::addmm" for e in prof.key_averages())
        acc.wait_for_everyone()
        r["traces"] = sorted(os.listdir(trace_dir))

        # get_logger: main only, every rank, in order
        logger.info("main only")
        acc.wait_for_everyone()
        logger.warning("every rank", main_process_only=False)
        acc.wait_for_everyone()
        logger.info("in order", in_order=True)
        acc.wait_for_everyone()
        handler.close()
        acc.end_training()
        return r
    """
)


def _run(source: str, folder: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<ported>", "exec"), namespace)
    return namespace["main"](folder)  # type: ignore[no-any-return]


def test_the_by_feature_names_give_accelerates_answers(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("schedulefree")
    ours_source = BODY.replace("from accelerate.utils import", "from notebook_accel.utils import")
    ours_source = ours_source.replace("from accelerate.local_sgd", "from notebook_accel.local_sgd")
    ours_source = ours_source.replace("from accelerate.logging", "from notebook_accel.logging")
    ours_source = ours_source.replace("from accelerate import", "from notebook_accel import")
    assert "accelerate" not in ours_source.replace("notebook_accel", "")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "ours").mkdir()
    theirs = debug_launcher(_run, args=(BODY, str(tmp_path / "theirs")), num_processes=2)
    ours = debug_launcher(_run, args=(ours_source, str(tmp_path / "ours")), num_processes=2)
    assert ours == theirs
    assert theirs[0]["traces"] == ["profile_0.json", "profile_1.json"]
    trace, end = theirs[0]["local_sgd"]
    assert trace[1] == theirs[1]["local_sgd"][0][1] and trace[0] != theirs[1]["local_sgd"][0][0]
    logs = {}
    for side in ("theirs", "ours"):
        lines = (tmp_path / side / "log.txt").read_text().splitlines()
        # "every rank" lines come in either order (nothing orders the two ranks there)
        logs[side] = (lines[0], sorted(lines[1:3]), lines[3:])
    assert logs["ours"] == logs["theirs"]
    assert logs["ours"][0] == "[RANK 0] main only"
    assert logs["ours"][2] == ["[RANK 0] in order", "[RANK 1] in order"]
