"""A rank's side, in the worker process: ``worker.py`` (a launch's rank), ``serve.py`` (a
session's loop), ``worker_store.py`` (env:// meeting in the launch's private store)."""
