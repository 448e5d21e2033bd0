"""Sharded checkpoints: models and optimizers through torch.distributed.checkpoint (DCP).

    save_state (every rank, inside checkpoint.save_state's staging folder)
        <staging>/sharded/   DCP: {"model_<i>": ..., "optimizer_<j>": ...}, each rank its shards
        the rest (schedulers, loaders, custom objects, RNG states, notebook_accel.json) as
        folder.py writes it for DDP; its counts say 0 models and 0 optimizers.
    load_state
        DCP reads the shards this job's layout needs from whatever layout wrote them: a
        checkpoint saved by 2 processes loads into 1 (or into another FSDP layout).
        Nothing is unpickled but DCP's own metadata classes (``.metadata``, through
        _MetadataUnpickler) and tensors and plain data (the state's non-tensor values, with
        ``weights_only=True``), unless the caller trusts the folder.

Keys are qualified parameter names (``get_model_state_dict``/``get_optimizer_state_dict``), so a
plain module and an FSDP module read and write the same checkpoint.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ...errors import CheckpointError
from ..strategies.sharder import is_sharded
from .files import untrusted
from .folder import Stateful, find

__all__ = ["SHARDED_DIR", "ShardedPart", "merge_fsdp_weights", "split"]

SHARDED_DIR = "sharded"

# What DCP's .metadata pickle may name: its own metadata classes, and the few torch and pathlib
# values they hold. Anything else (a planted os.system, say) is refused by name.
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "ChunkStorageMetadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata classes and torch dtypes, and refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")


class _SafeReader(dcp.FileSystemReader):
    """DCP's file reader, with the metadata read (once) through :class:`_MetadataUnpickler`."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._read: dict[int | None, dcp_metadata.Metadata] = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        rank = kwargs.get("rank")
        if rank not in self._read:
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            self._read[rank] = _safe_metadata(Path(self.path) / name, self.load_id)
        return self._read[rank]


def _safe_metadata(path: Path, load_id: str) -> dcp_metadata.Metadata:
    with open(path, "rb") as file:
        try:
            metadata = _MetadataUnpickler(file).load()
        except pickle.UnpicklingError as err:
            raise untrusted(path, err) from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise CheckpointError(path, f"holds a {type(metadata).__name__}, not DCP metadata")
    storage = getattr(metadata, "storage_meta", None) or dcp_metadata.StorageMeta()
    storage.load_id = load_id  # as FileSystemReader does
    metadata.storage_meta = storage
    return metadata


class _SafePlanner(dcp.DefaultLoadPlanner):
    """DCP's load planner, reading non-tensor values with ``weights_only=True``.

    DCP itself loads them with ``weights_only=False``; here each is loaded safely first and
    handed on re-serialised, so the full unpickling runs only on bytes this process made.
    DCP wraps what this raises in its own exception: ``refused`` keeps ours.
    """

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.refused: CheckpointError | None = None

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            where = f"{self.folder} (the value of {read_item.dest_index.fqn})"
            self.refused = untrusted(where, err)
            raise self.refused from None
        again = io.BytesIO()
        torch.save(loaded, again)
        again.seek(0)
        super().load_bytes(read_item, again)


def _module(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # a DDP wrapper in a mixed job


@dataclass
class ShardedPart:
    """The models and optimizers a checkpoint stores with DCP.

    Example:
        >>> rest, part = split(objects)  # doctest: +SKIP
        >>> part.save(staging_folder)  # doctest: +SKIP
    """

    models: list[torch.nn.Module]
    optimizers: list[Any]

    def _owner(self, index: int, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        # The optimizer's state is keyed by the names of the model that holds its parameters.
        first = next((p for g in optimizer.param_groups for p in g["params"]), None)
        for model in self.models:
            if any(p is first for p in _module(model).parameters()):
                return _module(model)
        raise CheckpointError(
            f"optimizer {index}",
            "its parameters belong to no prepared model; prepare the model it optimizes",
        )

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            f"model_{i}": get_model_state_dict(_module(m)) for i, m in enumerate(self.models)
        }
        for j, wrapped in enumerate(self.optimizers):
            raw = getattr(wrapped, "optimizer", wrapped)
            state[f"optimizer_{j}"] = get_optimizer_state_dict(self._owner(j, raw), raw)
        return state

    def save(self, folder: Path) -> None:
        """Every rank writes its shards into ``folder/sharded`` (a collective call)."""
        dcp.save(self._state(), checkpoint_id=folder / SHARDED_DIR)

    def load(self, folder: Path, trusted: bool = False) -> None:
        """Every rank reads what its shards need from ``folder/sharded``.

        Args:
            folder: the checkpoint folder.
            trusted: the caller's opt-in to DCP's own full unpickling.

        Raises:
            CheckpointError: the folder has no sharded part, its keys do not match, or a file
                needs full unpickling and ``trusted`` is off.
        """
        path = folder / SHARDED_DIR
        if not (path / ".metadata").is_file():
            raise CheckpointError(path, "missing: the checkpoint was not saved with FSDP")
        state = self._state()
        options: dict[str, Any] = {"checkpoint_id": path}
        planner = None
        if not trusted:
            reader = _SafeReader(path)
            reader.read_metadata()  # refused here, in our frame, rather than inside DCP's steps
            planner = _SafePlanner(path)
            options.update(storage_reader=reader, planner=planner)
        try:
            with warnings.catch_warnings():
                # One process without a group is the intended 2 -> 1 resharding load.
                warnings.filterwarnings("ignore", "torch.distributed is disabled")
                dcp.load(state, **options)
        except CheckpointException:
            if planner is not None and planner.refused is not None:
                raise planner.refused from None
            raise
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(
                path, f"does not match the prepared models/optimizers: {err}"
            ) from err
        for i, model in enumerate(self.models):
            set_model_state_dict(_module(model), state[f"model_{i}"])
        for j, wrapped in enumerate(self.optimizers):
            raw = getattr(wrapped, "optimizer", wrapped)
            set_optimizer_state_dict(self._owner(j, raw), raw, state[f"optimizer_{j}"])


def _saved_sharded(directory: str | os.PathLike[str]) -> bool | None:
    """Whether the checkpoint has a DCP part; None when there is no checkpoint at all."""
    try:
        return (find(directory) / SHARDED_DIR).is_dir()
    except CheckpointError:
        return None


def split(
    objects: Stateful, directory: str | os.PathLike[str] | None = None
) -> tuple[Stateful, ShardedPart | None]:
    """Separate the DCP part from what ``folder.py`` saves as plain files.

    The DCP part is used when a prepared model is sharded, or when ``directory`` (a
    checkpoint about to be loaded) was saved sharded. Otherwise the objects come back whole.
    """
    sharded = any(is_sharded(_module(m)) for m in objects.model)
    on_disk = None if directory is None else _saved_sharded(directory)
    if sharded and on_disk is False:
        raise CheckpointError(
            find(directory),  # type: ignore[arg-type]
            "was saved without FSDP (whole model.safetensors files) and cannot be loaded into "
            "sharded models; load it with fsdp off, then save_state to get a sharded one",
        )
    if not sharded and not on_disk:
        return objects, None
    rest = replace(objects, model=[], optimizer=[])
    return rest, ShardedPart(list(objects.model), list(objects.optimizer))


def _dcp_folder(checkpoint_dir: Path) -> tuple[Path, str]:
    """The DCP folder and the key prefix of the (first) model inside it: a save_state folder
    of ours (``sharded/``, ``model_0``), its ``sharded/`` itself, or accelerate's
    ``pytorch_model_fsdp_0`` (``model``)."""
    for folder in (checkpoint_dir / SHARDED_DIR, checkpoint_dir):
        if (folder / ".metadata").is_file():
            keys = _safe_metadata(folder / ".metadata", "").state_dict_metadata
            prefix = "model_0" if any(k.startswith("model_0.") for k in keys) else "model"
            return folder, prefix
    raise CheckpointError(
        checkpoint_dir,
        "holds no DCP checkpoint (.metadata): pass a save_state folder saved with FSDP, its "
        "sharded/ folder, or accelerate's pytorch_model_fsdp_0",
    )


def merge_fsdp_weights(
    checkpoint_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> Path | None:
    """accelerate's ``merge_fsdp_weights``: the model's shards as one whole weights file.

    Reads the (first) model of a sharded checkpoint, nothing of its optimizers, through the
    same guarded DCP reader as ``load_state`` (no pickle but DCP's own metadata classes), and
    writes ``output_path/model.safetensors`` (``pytorch_model.bin`` without
    ``safe_serialization``) on the main process; the others wait. Call it from one process,
    or from every process of a job.

    Args:
        checkpoint_dir: a ``save_state`` folder saved with FSDP (or its ``sharded/``), or
            accelerate's ``pytorch_model_fsdp_0`` folder.
        output_path: the folder to write into (made if missing).
        safe_serialization: safetensors (else ``torch.save``).
        remove_checkpoint_dir: delete ``checkpoint_dir`` afterwards (main process).

    Returns:
        The file written (None on the other processes).

    Example:
        >>> from notebook_accel.utils import merge_fsdp_weights
        >>> merge_fsdp_weights("ckpt", "merged")  # doctest: +SKIP
        PosixPath('merged/model.safetensors')
    """
    import shutil

    import torch.distributed as dist

    from .files import save_weights_file

    grouped = dist.is_available() and dist.is_initialized()
    written: Path | None = None
    if not grouped or dist.get_rank() == 0:
        folder, prefix = _dcp_folder(Path(checkpoint_dir))
        metadata = _safe_metadata(folder / ".metadata", "")
        template: dict[str, torch.Tensor] = {}
        for key, item in metadata.state_dict_metadata.items():
            if key.startswith(prefix + ".") and isinstance(
                item, dcp_metadata.TensorStorageMetadata
            ):
                template[key] = torch.empty(item.size, dtype=item.properties.dtype)
        if not template:
            raise CheckpointError(folder, f"has no tensors under {prefix!r}")
        with warnings.catch_warnings():
            # one process reads every shard, on purpose
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(
                template,
                storage_reader=_SafeReader(folder),
                planner=_SafePlanner(folder),
                no_dist=True,
            )
        weights = {key[len(prefix) + 1 :]: value for key, value in template.items()}
        target = Path(output_path)
        target.mkdir(parents=True, exist_ok=True)
        written = target / ("model.safetensors" if safe_serialization else "pytorch_model.bin")
        save_weights_file(weights, written, safe=safe_serialization)
        if remove_checkpoint_dir:
            shutil.rmtree(checkpoint_dir)
    if grouped:
        dist.barrier()
    return written
