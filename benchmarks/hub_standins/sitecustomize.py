"""Installed in every Python process the examples harness starts (it is on their PYTHONPATH).

Python imports ``sitecustomize`` at start-up, so the stand-ins reach every process of a run:
the example's own process, accelerate's forked workers, and our forkserver's workers alike.
Nothing heavy is imported here: a meta-path finder waits for the modules below and patches
each right after it has executed.

- ``datasets``, ``evaluate``, transformers' auto classes: the offline stand-ins (standins.py).
- ``Accelerator`` (accelerate's and ours): ``prepare`` remembers the models it returns, and
  ``end_training`` prints a hash of the last one's weights on the main process
  (``@@harness weights <sha256>``): the harness compares runs by it.
- the FSDP example's GPU memory meter: device figures 0 on a CPU (its CPU figures are real).
- notebook_accel comes from the tree on PYTHONPATH only (an editable install's finder of
  another checkout is dropped).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

Hook = Callable[[types.ModuleType], None]


def _standins() -> Any:
    import standins

    return standins


def _patch_datasets(module: types.ModuleType) -> None:
    module.load_dataset = _standins().load_dataset  # type: ignore[attr-defined]


def _patch_evaluate(module: types.ModuleType) -> None:
    module.load = _standins().load_metric  # type: ignore[attr-defined]


def _patch_tokenizer(module: types.ModuleType) -> None:
    def from_pretrained(cls: type, name: str, *args: Any, **kwargs: Any) -> Any:
        return _standins().tokenizer(name)

    module.AutoTokenizer.from_pretrained = classmethod(from_pretrained)


def _patch_config(module: types.ModuleType) -> None:
    def from_pretrained(cls: type, name: str, *args: Any, **kwargs: Any) -> Any:
        return _standins().config(name, **kwargs)

    module.AutoConfig.from_pretrained = classmethod(from_pretrained)


def _patch_models(module: types.ModuleType) -> None:
    def from_pretrained(cls: type, name: str, *args: Any, **kwargs: Any) -> Any:
        return _standins().model(cls, name, **kwargs)

    for name in ("AutoModelForSequenceClassification", "AutoModelForCausalLM"):
        getattr(module, name).from_pretrained = classmethod(from_pretrained)


_PREPARED: list[tuple[Any, Any]] = []  # (accelerator, model) in the order prepare returned them


def weights_digest(state: dict[str, Any]) -> str:
    """sha256 of a state dict: every tensor's name, dtype, shape and bytes, names sorted."""
    import torch

    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _report_weights(accelerator: Any) -> None:
    models = [model for owner, model in _PREPARED if owner is accelerator]
    if not models:
        line = "@@harness weights none"
    else:
        try:
            try:
                state = accelerator.get_state_dict(models[-1])
            except Exception:
                state = accelerator.unwrap_model(models[-1]).state_dict()
            line = f"@@harness weights {weights_digest(state)}"
        except Exception as error:  # the hash is a measurement: never fail the run on it
            line = f"@@harness weights unavailable ({type(error).__name__}: {error})"
    if accelerator.is_main_process:
        source = sys.modules[type(accelerator).__module__].__file__
        print(f"{line} (the Accelerator of {source})", flush=True)


def _patch_accelerator(module: types.ModuleType) -> None:
    import torch

    cls = module.Accelerator
    prepare, end_training = cls.prepare, cls.end_training

    @functools.wraps(prepare)
    def prepare_and_remember(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = prepare(self, *args, **kwargs)
        for obj in result if isinstance(result, tuple) else (result,):
            if isinstance(obj, torch.nn.Module):
                _PREPARED.append((self, obj))
        return result

    @functools.wraps(end_training)
    def end_training_and_hash(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = end_training(self, *args, **kwargs)
        _report_weights(self)
        return result

    cls.prepare, cls.end_training = prepare_and_remember, end_training_and_hash


def _patch_gpu_meter(module: types.ModuleType) -> None:
    """The FSDP example's TorchTracemalloc reads device memory only on CUDA/XPU/NPU; on a CPU
    its ``__exit__`` fails on the unset ``end``. Device figures read 0 here (class defaults);
    its CPU figures (RSS, peak RSS) are measured as written."""
    meter = module.TorchTracemalloc
    meter.begin = meter.end = meter.peak = 0


HOOKS: dict[str, Hook] = {
    "fsdp_with_peak_mem_tracking": _patch_gpu_meter,
    "datasets": _patch_datasets,
    "evaluate": _patch_evaluate,
    "transformers.models.auto.tokenization_auto": _patch_tokenizer,
    "transformers.models.auto.configuration_auto": _patch_config,
    "transformers.models.auto.modeling_auto": _patch_models,
    "accelerate.accelerator": _patch_accelerator,
    "notebook_accel.training.accelerator": _patch_accelerator,
}


class _ThenPatch(importlib.abc.Loader):
    """A module's own loader, then its hook; every other attribute is the loader's."""

    def __init__(self, loader: Any, hook: Hook) -> None:
        self._loader, self._hook = loader, hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        hook = HOOKS.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenPatch(spec.loader, hook)
                return spec
        return None


def _only_the_tree_on_the_path() -> None:
    """Drop the editable install's finder of notebook_accel: the tree the harness measures is
    the one on PYTHONPATH, and a module it lacks must fail, not come from another checkout."""
    sys.meta_path[:] = [
        finder
        for finder in sys.meta_path
        if not getattr(finder, "__module__", "").startswith("__editable___notebook_accel")
    ]


_only_the_tree_on_the_path()
if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport())
