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
    taken = [int(path.stem.split("-")[1]) for path in root.glob("weights-[0-9]*.safetensors")]
    name = f"weights-{max(taken, default=0) + 1:05d}.safetensors"
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


_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}  # fmt: skip


class SafetensorsFile:
    """One safetensors file read a tensor at a time with ``pread`` into a fresh tensor.

    The header (names, dtypes, shapes, offsets: JSON, never code) is read once; the file
    stays open but unmapped, so what a forward pass read is freed with the tensor and never
    stays resident as mapped file pages.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        size = int.from_bytes(os.pread(self.fd, 8, 0), "little")
        self.header = json.loads(os.pread(self.fd, size, 8))
        self.header.pop("__metadata__", None)
        self.start = 8 + size

    def read(self, key: str) -> torch.Tensor:
        import torch

        info = self.header[key]
        begin, end = info["data_offsets"]
        raw = torch.empty(end - begin, dtype=torch.uint8)
        if end > begin:
            done = os.preadv(self.fd, [raw.numpy().data], self.start + begin)
            if done != end - begin:
                raise OSError(f"short read of {key}: {done} of {end - begin} bytes")
        dtype = getattr(torch, _DTYPES[info["dtype"]])
        return raw.view(dtype).reshape(info["shape"])

    def __del__(self) -> None:
        if hasattr(self, "fd"):
            os.close(self.fd)


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
        self._files: dict[str, SafetensorsFile] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.state_dict:
            return self.state_dict[name]
        entry = self.index[name]
        assert self.folder is not None
        tensor = self._file(entry["file"]).read(entry["key"])
        return tensor if self.device is None else tensor.to(self.device)

    def _file(self, name: str) -> SafetensorsFile:
        found = self._files.get(name)
        if found is None:
            assert self.folder is not None
            found = self._files[name] = SafetensorsFile(self.folder / name)
        return found

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
