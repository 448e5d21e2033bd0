"""The API surface added for ported code gives accelerate's answers: one body, two imports.

The same function body runs on 2 gloo processes with ``accelerate``'s imports and then with
ours (only the import lines differ), and every recorded answer must agree (accelerate is in
the ``dev`` extra; skipped where it is not installed).
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from notebook_accel import debug_launcher

BODY = textwrap.dedent(
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from accelerate import Accelerator, PartialState
    from accelerate.utils import (
        DistributedDataParallelKwargs,
        InitProcessGroupKwargs,
        find_executable_batch_size,
    )

    def main():
        acc = Accelerator(
            cpu=True,
            kwargs_handlers=[
                InitProcessGroupKwargs(timeout=timedelta(seconds=99)),
                DistributedDataParallelKwargs(bucket_cap_mb=2),
            ],
        )
        r = {"last": acc.is_last_process}
        r["on_process"] = acc.on_process(lambda: "ran", process_index=1)()
        r["on_process_positional"] = acc.on_process(lambda: "ran", 0)()

        @acc.on_local_process(local_process_index=1)
        def on_local():
            return "ran"

        r["on_local_process"] = on_local()
        r["on_last_process"] = acc.on_last_process(lambda: "ran")()
        r["on_main_process"] = acc.on_main_process(lambda: "ran")()
        r["trigger"] = [acc.check_trigger()]
        if acc.process_index == 0:
            acc.set_trigger()
        r["trigger"] += [acc.check_trigger(), acc.check_trigger()]
        s = PartialState()
        r["partial"] = (
            s.process_index,
            s.num_processes,
            s.local_process_index,
            s.is_main_process,
            s.is_local_main_process,
            s.is_last_process,
            s.distributed_type == "MULTI_CPU",
            s.backend,
            s.use_distributed,
        )
        r["partial_on_last"] = s.on_last_process(lambda: "ran")()
        with s.split_between_processes([1, 2, 3], apply_padding=True) as mine:
            r["split"] = mine
        model = acc.prepare_model(torch.nn.Linear(2, 2))
        r["ddp"] = (type(model).__name__, model.bucket_bytes_cap)
        r["eval"] = type(acc.prepare_model(torch.nn.Linear(2, 2), evaluation_mode=True)).__name__
        r["free"] = acc.free_memory(model)
        r["state"] = (acc.state.process_index, acc.state.num_processes, acc.state.is_main_process)
        world = dist.group.WORLD
        r["timeout"] = world._get_backend(torch.device("cpu")).options._timeout.total_seconds()

        @find_executable_batch_size(starting_batch_size=10)
        def fits(batch_size):
            if batch_size > 5:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
            return batch_size

        r["batch_size"] = fits()
        return r
    """
)


def _run(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<ported>", "exec"), namespace)
    return namespace["main"]()  # type: ignore[no-any-return]


def test_the_same_code_gives_accelerates_answers() -> None:
    pytest.importorskip("accelerate")
    ours_source = BODY.replace("from accelerate.utils import", "from notebook_accel.utils import")
    ours_source = ours_source.replace("from accelerate import", "from notebook_accel import")
    theirs = debug_launcher(_run, args=(BODY,), num_processes=2)
    ours = debug_launcher(_run, args=(ours_source,), num_processes=2)
    assert ours == theirs
    assert theirs[1]["on_process"] == "ran" and theirs[0]["trigger"] == [False, True, False]
