"""``DataLoaderConfiguration(use_stateful_dataloader=True)``: accelerate's own check, on ours.

accelerate's ``test_stateful_dataloader`` and ``test_stateful_dataloader_save_state`` (in its
``test_utils/scripts/test_distributed_data_loop.py``, run on 2 processes) rewritten for ours,
with the same assertions: a prepared loader's ``state_dict()`` taken after 3 batches (or
``save_state`` there), loaded after the epoch, gives exactly the batches that followed, for a
map-style and an iterable dataset. Ours needs no torchdata: prepared loaders keep their
epoch, position and random draws themselves.

One change beyond the import: accelerate's body saves into a ``tempfile.TemporaryDirectory()``
made by each rank (a folder per rank, of different names); ours pairs a rank's ``save_state``
with the writer's by the folder's name, so the ranks here share one folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from notebook_accel import debug_launcher


class DummyIterableDataset(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from self.data


def create_dataloader(
    accelerator: Any, dataset_size: int, batch_size: int, iterable: bool, shuffle: bool
) -> Any:
    values = torch.as_tensor(range(dataset_size))
    if shuffle:
        values = values[torch.randperm(values.size(0))]
    dataset: Any = DummyIterableDataset(values) if iterable else TensorDataset(values)
    return accelerator.prepare(DataLoader(dataset, batch_size=batch_size))


def _resume(accelerator: Any, iterable: bool, through_save_state: bool, folder: str) -> int:
    from notebook_accel import DataLoaderConfiguration

    old_dataloader_config = accelerator.dataloader_config
    try:
        accelerator.dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True)
        prepared_dl = create_dataloader(
            accelerator, 32 * accelerator.num_processes, 4, iterable=iterable, shuffle=True
        )
        assert prepared_dl.use_stateful_dataloader and accelerator.use_stateful_dataloader
        untrained_batches = []
        save_step = 2
        state_dict = None
        for step, batch in enumerate(prepared_dl):
            if step == save_step:
                if through_save_state:
                    accelerator.save_state(folder)
                else:
                    state_dict = prepared_dl.state_dict()
            if step > save_step:
                untrained_batches.append(batch)
        not_skipped_batches = accelerator.gather(untrained_batches)
        if through_save_state:
            accelerator.load_state(folder)
        else:
            prepared_dl.load_state_dict(state_dict)
        resumed_batches = []
        for batch in prepared_dl:
            resumed_batches.append(batch)
        resumed_batches = accelerator.gather(resumed_batches)
        assert len(not_skipped_batches) == len(resumed_batches), (
            f"Expected {len(not_skipped_batches)} batches after resume, got {len(resumed_batches)}"
        )
        for b1, b2 in zip(not_skipped_batches, resumed_batches, strict=True):
            for v1, v2 in zip(b1, b2, strict=True):
                assert torch.equal(v1, v2), f"Batch {b1} and {b2} are not equal"
        return len(resumed_batches)
    finally:
        accelerator.dataloader_config = old_dataloader_config


def _main(folder: str) -> dict[str, int]:
    from notebook_accel import Accelerator, DataLoaderConfiguration

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=True))
    assert accelerator.num_processes == 2
    torch.manual_seed(accelerator.process_index)
    out = {}
    for through_save_state in (False, True):
        for iterable in (True, False):
            name = f"{'save_state' if through_save_state else 'state_dict'}-{iterable=}"
            out[name] = _resume(accelerator, iterable, through_save_state, f"{folder}/{name}")
    return out


def test_stateful_dataloader_state_dict_and_save_state(tmp_path: Path) -> None:
    for result in debug_launcher(_main, (str(tmp_path),), num_processes=2):
        # 8 batches per rank per epoch; 3 seen before the save; 5 per rank gathered after
        assert result == dict.fromkeys(result, 5) and len(result) == 4


def test_use_stateful_dataloader_is_accepted_and_checked() -> None:
    import pytest

    from notebook_accel import Accelerator, DataLoaderConfiguration
    from notebook_accel.errors import ConfigError

    accelerator = Accelerator(
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)
    )
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(10)), batch_size=2))
    assert loader.use_stateful_dataloader and accelerator.use_stateful_dataloader
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    loader.load_state_dict(state)
    assert [b.tolist() for (b,) in loader] == [[4, 5], [6, 7], [8, 9]]
    with pytest.raises(ConfigError, match="use_stateful_dataloader"):
        DataLoaderConfiguration(use_stateful_dataloader="yes")  # type: ignore[arg-type]
