"""Data loaders across processes: ``sharding.py``'s ``shard_data_loader`` is what
``Accelerator.prepare`` calls; ``loader.py`` (DataLoaderShard), ``rounds.py`` (which batches
each rank takes), ``randomness.py`` (an epoch's draws in step across ranks), ``iterable.py``
(IterableDataset loaders), ``rng.py`` (``rng_types``), ``config.py``
(DataLoaderConfiguration)."""
