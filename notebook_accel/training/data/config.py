"""DataLoaderConfiguration: how ``prepare`` shards data loaders (accelerate's names).

Example:
    >>> from notebook_accel import Accelerator, DataLoaderConfiguration
    >>> config = DataLoaderConfiguration(split_batches=True, even_batches=False)
    >>> accelerator = Accelerator(dataloader_config=config)  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError

__all__ = ["DataLoaderConfiguration"]


@dataclass
class DataLoaderConfiguration:
    """Options for the data loaders an Accelerator prepares.

    Args:
        split_batches: the loader's batch size is the global one, cut across processes
            (default: every process gets batches of the loader's size).
        dispatch_batches: the main process reads the data and sends each process its part;
            ``None``: only for an ``IterableDataset`` (each process reads its own shard of a
            map-style dataset).
        even_batches: complete the last round of an epoch with samples from its start, so
            every process gets as many batches (``gather_for_metrics`` drops the repeats).
        use_seedable_sampler: shuffle with a permutation drawn from ``data_seed + epoch``
            (the same on every process) instead of the loader's own ``RandomSampler`` stream.
        data_seed: the seed of ``use_seedable_sampler`` (``None``: the main process's
            ``torch.initial_seed()``).
        non_blocking: move batches to the device with ``non_blocking=True`` (useful with
            ``pin_memory=True`` on CUDA).
        use_stateful_dataloader: prepared loaders with torchdata ``StatefulDataLoader``'s
            ``state_dict()`` / ``load_state_dict()`` (resume mid-epoch from the dict). Ours
            have them either way, without torchdata (they keep their epoch, position and
            random draws); the flag is what ``Accelerator.use_stateful_dataloader`` and the
            prepared loader's ``use_stateful_dataloader`` report.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        flags = ("split_batches", "even_batches", "use_seedable_sampler", "non_blocking")
        for name in (*flags, "use_stateful_dataloader"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "True or False")
        if self.dispatch_batches not in (None, True, False):
            raise ConfigError("dispatch_batches", self.dispatch_batches, "None, True or False")
        seed = self.data_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError("data_seed", seed, "an int or None")
