"""Weights kept off the model: in memory on the CPU, or in a folder of safetensors files.

    offload_dir/
      index.json                  {name: {"file": "weights-00001.safetensors", "key": name}}
      weights-00001.safetensors   one file per batch written (a shard's disk part, a block)

A weight is read from its file when a forward pass needs it and dropped after: nothing is
unpickled (safetensors only), and the process holds one block's weights at a time. Tied
names share one entry (the index names the same file and key).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

INDEX = "index.json"


def read_index(folder: str | os.PathLike[str]) -> dict[str, dict[str, str]]:
    """The folder's index (empty where there is none)."""
    path = Path(folder) / INDEX
    return json.loads(path.read_text()) if path.is_file() else {}


def write_tensors(
    folder: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor]
) -> dict[str, Any]:
    """Write ``tensors`` as one more safetensors file of ``folder`` and add them to its index.

    Two names for one storage are written once and indexed twice. Returns the new entries.

    Example:
        >>> write_tensors(tmp_path, {"0.weight": torch.ones(2)})  # doctest: +SKIP
        {'0.weight': {'file': 'weights-00001.safetensors', 'key': '0.weight'}}
    """
    from safetensors.torch import save_file

    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    index = read_index(root)
    name = f"weights-{len(list(root.glob('weights-*.safetensors'))) + 1:05d}.safetensors"
    unique: dict[str, torch.Tensor] = {}
    first: dict[tuple[int, tuple[int, ...], Any], str] = {}
    entries = {}
    for key, tensor in tensors.items():
        identity = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        kept = first.setdefault(identity, key) if tensor.data_ptr() else key
        if kept == key:
            unique[key] = tensor.detach().to("cpu").contiguous()
        entries[key] = {"file": name, "key": kept}
    if unique:
        save_file(unique, str(root / name))
    index.update(entries)
    (root / INDEX).write_text(json.dumps(index, indent=1))
    return entries


def alias(folder: str | os.PathLike[str], name: str, same_as: str) -> None:
    """Index ``name`` as the weight already written for ``same_as`` (tied parameters)."""
    index = read_index(folder)
    index[name] = index[same_as]
    (Path(folder) / INDEX).write_text(json.dumps(index, indent=1))


class OffloadedWeights(Mapping[str, "torch.Tensor"]):
    """Names -> tensors: CPU tensors held in memory, else read from a folder on each access.

    Args:
        state_dict: tensors kept in memory (the CPU-offloaded part).
        folder: an offload folder (its ``index.json``), for the disk-offloaded part.
        device: where a tensor read from the folder is put (default: the CPU).

    Example:
        >>> weights = OffloadedWeights(folder="offload")  # doctest: +SKIP
        >>> weights["transformer.h.3.mlp.c_fc.weight"].shape  # doctest: +SKIP
    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        folder: str | os.PathLike[str] | None = None,
        device: Any = None,
    ) -> None:
        self.state_dict = dict(state_dict or {})
        self.folder = Path(folder) if folder is not None else None
        self.index = read_index(self.folder) if self.folder is not None else {}
        self.device = device

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.state_dict:
            return self.state_dict[name]
        entry = self.index[name]
        assert self.folder is not None
        from safetensors import safe_open

        device = "cpu" if self.device is None else str(self.device)
        with safe_open(str(self.folder / entry["file"]), framework="pt", device=device) as file:
            return file.get_tensor(entry["key"])

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self.state_dict), **dict.fromkeys(self.index)})

    def __len__(self) -> int:
        return len(set(self.state_dict) | set(self.index))


class PrefixedWeights(Mapping[str, "torch.Tensor"]):
    """A view of ``weights`` under ``prefix``: what one submodule's hook reads.

    Example:
        >>> PrefixedWeights(weights, "transformer.h.0.")["ln_1.weight"]  # doctest: +SKIP
    """

    def __init__(self, weights: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.weights = weights
        self.prefix = prefix

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.weights[self.prefix + name]

    def __iter__(self) -> Iterator[str]:
        size = len(self.prefix)
        return (key[size:] for key in self.weights if key.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def offload_state_dict(save_dir: str | os.PathLike[str], state_dict: Mapping[str, Any]) -> None:
    """Write a whole state dict into an offload folder (accelerate.utils' name).

    Example:
        >>> offload_state_dict("offload", model.state_dict())  # doctest: +SKIP
    """
    write_tensors(save_dir, state_dict)
