"""What the notebook shows of a launch: rank-prefixed lines and bars (``display.py``), the
live chart (``charts.py``), a background job's display handles (``background.py``)."""
