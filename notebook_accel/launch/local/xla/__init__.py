"""TPU cores through torch_xla: ``engine.py`` starts torch_xla's processes with the launch's
payload, ``output.py`` relays their output (a unix socket, rank prefixes)."""
