"""The worker side of what the notebook shows, and the messages it sends.

    channel.py   the typed messages worker -> parent (Progress, Displayed, Metrics, Health,
                 Result, Failure) and the pipe's two ends
    progress.py  tqdm in a worker: throttled Progress messages, bars drawn by the parent
    shell.py     a notebook's rank's IPython shell: what it displays, as Displayed messages
    live.py      Accelerator.log rows batched to the parent, the health thread
    scalars.py   one number from what a user logs (the chart and the trackers share it)

The launcher's parent side (``launch/show/display.py``, ``launch/show/charts.py``,
``launch/show/rich.py``) draws them.
"""
