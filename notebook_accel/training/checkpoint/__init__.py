"""``save_state`` / ``load_state``: ``folder.py`` (accelerate's layout in an atomic staging
folder), ``files.py`` (safetensors weights and shards, torch.save state, accelerate's
random_states pickles), ``sharded.py`` (FSDP state through torch.distributed.checkpoint)."""
