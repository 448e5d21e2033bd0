"""The option classes a launch validates before any process starts.

    fsdp.py          FsdpConfig (``fsdp=``; imports torch for its dtypes, only when FSDP is
                     asked for)
    deepspeed.py     DeepSpeedPlugin (accelerate's names, torch-free): validated, ``"auto"``
                     filled into DeepSpeed's config; the launch option
    parallelism.py   ParallelismConfig (accelerate's mesh sizes, torch-free)
    dynamo.py        TorchDynamoPlugin, DynamoBackend (accelerate's torch.compile settings)
    rules.py         which options go together: every rule of combination, written once
                     (LaunchConfig, hardware.resolve, the launcher, Workers, the Accelerator)

``config.py``, ``hardware`` and the launcher read them; the training side builds on them.
"""
