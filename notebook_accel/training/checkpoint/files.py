"""Files of checkpoints and exported models, in the formats accelerate and transformers use.

    weights      safetensors (``model.safetensors``) or torch.save (``pytorch_model.bin``);
                 tensors that share storage (tied weights) are written once, as accelerate does
    shards       ``model-00001-of-00003.safetensors`` + ``model.safetensors.index.json``
    other state  torch.save, loaded back with ``weights_only=True``: tensors and plain data,
                 nothing that runs code; a file that needs more is refused unless the caller
                 trusts the folder (``load_state(folder, load_kwargs={"weights_only": False})``)
    RNG states   accelerate's ``random_states_<rank>.pkl`` dict; numpy's state is a numpy array,
                 so loading it allowlists exactly numpy's array-rebuilding globals

Every file is written to ``<name>.partial`` and renamed into place: a reader never sees half of
one.
"""

from __future__ import annotations

import codecs
import json
import os
import pickle
import random
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from ...errors import CheckpointError, ConfigError
from ...private import numpy as private_numpy

# accelerate's names of a checkpoint's files (accelerate.utils' constants, for code that
# builds paths with them); save_state writes exactly these (tests/training/checkpoint).
MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
FILE_NAMES = (
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
)

__all__ = [
    *FILE_NAMES,
    "write_atomic",
    "save_object",
    "load_object",
    "save_weights_file",
    "load_weights_file",
    "load_weights_into",
    "rng_file_state",
    "restore_rng_file_state",
    "load_rng_file",
    "untrusted",
    "save_model_files",
    "parse_size",
]

# Globals that numpy's state tuple needs when unpickled (accelerate's random_states_N.pkl):
# array and dtype reconstruction, and the codecs call protocol-2 pickles use for bytes.
_NUMPY_GLOBALS: list[Any] = [
    private_numpy.array_reconstructor(),
    np.ndarray,
    np.dtype,
    np.dtypes.UInt32DType,
    codecs.encode,
]


def write_atomic(path: Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(partial_path)``, then rename the result to ``path``."""
    partial = path.with_name(path.name + ".partial")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def save_object(obj: Any, target: str | os.PathLike[str] | IO[bytes]) -> None:
    """``torch.save`` to a path (atomically) or to an open binary file."""
    if isinstance(target, str | os.PathLike):
        write_atomic(Path(target), lambda p: torch.save(obj, p))
    else:
        torch.save(obj, target)


def load_object(path: Path, trusted: bool = False) -> Any:
    """``torch.load`` on the CPU with ``weights_only=True`` (numpy's RNG globals allowed).

    Args:
        path: the file.
        trusted: the caller opted in to full unpickling
            (``load_state(folder, load_kwargs={"weights_only": False})``): a file that
            ``weights_only`` refuses is then loaded whole, running whatever it holds.

    Raises:
        CheckpointError: the file is missing, or it needs full unpickling and is not trusted
            (the message names the file, what it needs, and the opt-in).
    """
    if not path.is_file():
        raise CheckpointError(path, "file missing; the folder is not a complete checkpoint")
    try:
        with torch.serialization.safe_globals(_NUMPY_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if not trusted:
            raise untrusted(path, err) from None
    return torch.load(path, map_location="cpu", weights_only=False)


def untrusted(path: object, err: BaseException) -> CheckpointError:
    """The refusal of a file that holds more than tensors and plain data."""
    found = re.search(r"GLOBAL (\S+)", str(err))
    what = f" (it names {found.group(1)})" if found else ""
    return CheckpointError(
        path,
        f"holds pickled Python objects beyond tensors and plain data{what}, and unpickling "
        "them runs code chosen by whoever wrote the file, so it was not loaded. If you trust "
        "this checkpoint: load_state(folder, load_kwargs={'weights_only': False})",
    )


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    # Two names for one storage (tied embeddings) must be written once: safetensors refuses
    # aliases. Meta/sparse tensors have no data pointer worth comparing.
    try:
        return (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.untyped_storage().nbytes(),
        )
    except (RuntimeError, NotImplementedError):
        return (id(tensor),)


def drop_aliases(weights: Mapping[str, Any]) -> dict[str, Any]:
    """``weights`` without the second and later names of tensors that share storage."""
    seen: set[tuple[Any, ...]] = set()
    kept: dict[str, Any] = {}
    for name, value in weights.items():
        if isinstance(value, torch.Tensor):
            key = _storage_key(value)
            if key in seen:
                continue
            seen.add(key)
        kept[name] = value
    return kept


def save_weights_file(
    weights: Mapping[str, Any], target: str | os.PathLike[str] | IO[bytes], safe: bool
) -> None:
    """Write a state dict as safetensors (``safe``) or with ``torch.save``."""
    if not safe:
        save_object(dict(weights), target)
        return
    from safetensors.torch import save, save_file

    if any(isinstance(v, torch.Tensor) and v.device.type == "xla" for v in weights.values()):
        # XLA tensors report one shared storage: compare aliases on CPU copies instead.
        weights = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in weights.items()}
    tensors = {
        k: v.detach().contiguous()
        for k, v in drop_aliases(weights).items()
        if isinstance(v, torch.Tensor)
    }
    if isinstance(target, str | os.PathLike):
        write_atomic(Path(target), lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    else:
        target.write(save(tensors, metadata={"format": "pt"}))


def load_weights_file(path: Path, trusted: bool = False) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors`` or a torch file (``weights_only``), on the CPU."""
    if not path.is_file():
        raise CheckpointError(path, "file missing; the folder is not a complete checkpoint")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path, device="cpu")
    return dict(load_object(path, trusted))


def load_weights_into(model: torch.nn.Module, weights: dict[str, torch.Tensor], path: Path) -> None:
    """Load ``weights`` into ``model``, accepting what accelerate's files differ in.

    A checkpoint saved by accelerate from a DDP model has every key prefixed ``module.``;
    names dropped as aliases on save (tied weights) come back through the name kept.

    Raises:
        CheckpointError: keys or shapes do not match (it names ``path``).
    """
    own = model.state_dict()
    if (
        weights
        and all(k.startswith("module.") for k in weights)
        and not any(k.startswith("module.") for k in own)
    ):
        weights = {k[len("module.") :]: v for k, v in weights.items()}
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as err:
        raise CheckpointError(path, f"does not match the model: {err}") from err
    loaded = {_storage_key(own[k]) for k in weights if k in own}
    missing = [k for k in missing if _storage_key(own[k]) not in loaded]
    if missing or unexpected:
        raise CheckpointError(
            path, f"does not match the model: missing keys {missing}, unexpected keys {unexpected}"
        )


# ---- random states, as accelerate writes them ------------------------------------------------
def rng_file_state(step: int) -> dict[str, Any]:
    """This process's generators in accelerate's ``random_states_<rank>.pkl`` layout."""
    state: dict[str, Any] = {
        "step": step,
        "random_state": random.getstate(),
        "numpy_random_seed": np.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    # Reading CUDA's states would initialise CUDA in a process that has not used it.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_file_state(state: Mapping[str, Any]) -> None:
    """Put back the generators that :func:`rng_file_state` (or accelerate) saved."""
    random.setstate(state["random_state"])
    np.random.set_state(state["numpy_random_seed"])
    torch.set_rng_state(state["torch_manual_seed"])
    if "torch_cuda_manual_seed" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda_manual_seed"])


def load_rng_file(path: Path, trusted: bool = False) -> dict[str, Any]:
    """Read a ``random_states_<rank>.pkl`` without running arbitrary pickled code."""
    return dict(load_object(path, trusted))


# ---- whole-model export (save_model) ---------------------------------------------------------
_UNITS = {"": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def parse_size(size: int | str) -> int:
    """Bytes from ``5000000``, ``"5MB"`` (10**6) or ``"5MiB"`` (2**20).

    Raises:
        ConfigError: anything else.
    """
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    found = (
        re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", size)
        if isinstance(size, str)
        else None
    )
    if found is None or found.group(2).upper() not in _UNITS or float(found.group(1)) <= 0:
        raise ConfigError("max_shard_size", size, 'bytes as an int > 0, or a string like "5GB"')
    return int(float(found.group(1)) * _UNITS[found.group(2).upper()])


def _nbytes(value: Any) -> int:
    if not isinstance(value, torch.Tensor):
        return 0
    try:  # the storage's size, as the Hub counts it (a view costs its whole storage)
        return int(value.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return value.numel() * value.element_size()


def _shards(weights: dict[str, Any], limit: int) -> list[list[str]]:
    # The Hub's rule, so files and index match accelerate's and transformers': in order, a new
    # shard when the next tensor would overflow the current one; a tensor bigger than the limit
    # goes to a shard of its own, placed before the one being filled.
    shards: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name, value in weights.items():
        nbytes = _nbytes(value)
        if nbytes > limit:
            shards.append([name])
            continue
        if current and size + nbytes > limit:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    if current or not shards:
        shards.append(current)
    return shards


def save_model_files(
    weights: dict[str, Any], directory: Path, safe: bool, max_shard_size: int | str
) -> list[Path]:
    """Write ``weights`` as ``model.safetensors`` (or ``pytorch_model.bin``), sharded if large.

    Shards are ``model-00001-of-0000N.safetensors`` with ``model.safetensors.index.json``
    (``weight_map``: tensor name -> file), the layout ``transformers`` and accelerate read.
    Shard files of an earlier, differently split save in ``directory`` are removed.
    """
    stem, ext = ("model", ".safetensors") if safe else ("pytorch_model", ".bin")
    weights = drop_aliases(weights) if safe else dict(weights)
    groups = _shards(weights, parse_size(max_shard_size))
    directory.mkdir(parents=True, exist_ok=True)
    if len(groups) == 1:
        names = [f"{stem}{ext}"]
    else:
        names = [f"{stem}-{i + 1:05d}-of-{len(groups):05d}{ext}" for i in range(len(groups))]
    stale = re.compile(rf"{re.escape(stem)}-\d{{5}}-of-\d{{5}}{re.escape(ext)}")
    for old in directory.iterdir():
        if stale.fullmatch(old.name) and old.name not in names:
            old.unlink()
    written = []
    for name, group in zip(names, groups, strict=True):
        save_weights_file({k: weights[k] for k in group}, directory / name, safe)
        written.append(directory / name)
    index = directory / f"{stem}{ext}.index.json"
    if len(groups) > 1:
        content = {
            "metadata": {"total_size": sum(_nbytes(v) for v in weights.values())},
            "weight_map": {
                k: name for name, group in zip(names, groups, strict=True) for k in group
            },
        }
        text = json.dumps(content, indent=2, sort_keys=True) + "\n"
        write_atomic(index, lambda p: p.write_text(text, encoding="utf-8"))
        written.append(index)
    else:
        index.unlink(missing_ok=True)
    return written
