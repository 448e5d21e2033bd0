"""This machine's workers: the forkserver and its zygote (``forkserver.py``), pre-forked
workers (``idle.py``), one launch's supervision (``engine.py``), a session's kept workers
(``session.py``), TPU cores through torch_xla (``xla/``)."""
