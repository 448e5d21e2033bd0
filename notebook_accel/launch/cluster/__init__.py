"""The ranks of a launch on a cluster: the ``Backend`` interface (``backend.py``) and its
engines (``ray/``)."""
