"""Importing the package, or reaching the launcher, does not import torch (a notebook's
first launch starts the forkserver's torch import before the parent needs its own)."""

from __future__ import annotations

import subprocess
import sys


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, notebook_accel\n"
        "from notebook_accel import notebook_launcher, debug_launcher, LaunchConfig\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# The newest torch APIs the package uses, and the torch release that made each public.
_NEWEST_TORCH_APIS = {
    "torch.distributed.fsdp.fully_shard": (2, 6),  # pytorch#141868 (was _composable.fsdp)
    "torch.nn.utils.get_total_norm": (2, 6),  # pytorch#139662
    "torch.nn.utils.clip_grads_with_norm_": (2, 6),  # pytorch#139662
}


def test_declared_torch_floor_has_every_api_the_package_uses() -> None:
    import importlib
    import re
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    [torch_req] = [r for r in project["project"]["dependencies"] if r.startswith("torch")]
    floor = tuple(int(p) for p in re.search(r">=\s*([\d.]+)", torch_req).group(1).split("."))
    for name, since in _NEWEST_TORCH_APIS.items():
        module, attribute = name.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), attribute), name
        assert floor >= since, f"pyproject says {torch_req}, but {name} needs {since}"
