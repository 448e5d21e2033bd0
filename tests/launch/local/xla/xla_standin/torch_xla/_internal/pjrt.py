"""run_multiprocess: real processes (spawned, as torch_xla's pool), a thread per device."""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
from collections.abc import Callable
from typing import Any

from .. import runtime
from ..core import xla_model


def _device_thread(fn: Callable[[], Any], ordinal: int) -> Any:
    runtime._thread.ordinal = ordinal
    return fn()


def _run_process(index: int, processes: int, per_process: int, fn: Callable[[], Any]) -> dict:
    runtime._layout.update(processes=processes, per_process=per_process, process_index=index)
    xla_model._exchange_for(per_process)
    ordinals = [index * per_process + i for i in range(per_process)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=per_process) as threads:
        results = threads.map(functools.partial(_device_thread, fn), ordinals)
        return dict(zip(ordinals, results, strict=True))


def run_multiprocess(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[int, Any]:
    """Run ``fn(*args, **kwargs)`` on every device; {ordinal: result}, as torch_xla's does.

    A process that dies breaks the pool: BrokenProcessPool, and the others are terminated.
    """
    processes, per_process = runtime.topology()
    call = functools.partial(fn, *args, **kwargs)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context) as pool:
        parts = pool.map(
            functools.partial(_run_process, processes=processes, per_process=per_process, fn=call),
            range(processes),
        )
        merged: dict[int, Any] = {}
        for part in parts:
            merged.update(part)
    return merged
