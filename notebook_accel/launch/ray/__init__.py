"""A Ray cluster as a launch backend: ``backend.py`` (one streaming task per rank in a
placement group), ``local.py`` (a stand-in cluster on 127.0.0.1 for notebooks, tests and
benchmarks). Ray is imported only when a launch asks for ``cluster="ray"``."""
