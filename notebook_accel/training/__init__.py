"""What runs inside a worker: the ``Accelerator`` facade and everything it drives.

    accelerator.py   the facade: keeps the prepared objects, delegates each call
    state.py         ProcessState (rank, world, device, group), GradientState
    processes.py     PartialState: process facts and main-process helpers
    handlers.py      KwargsHandler and accelerate's option carriers
    collectives.py   gather, reduce, broadcast, pad, gather_object, split
    memory.py        release_memory, find_executable_batch_size
    compile.py       torch.compile in prepare: the whole model or its repeated blocks
    tracking.py      experiment trackers behind GeneralTracker
    project.py       ProjectConfiguration
    data/            loader sharding, rounds, epoch randomness, iterable datasets, config
    precision/       no / fp16 / bf16 / fp8 and the wrappers that step through them
    checkpoint/      save_state / load_state: the atomic folder, its files, DCP shards
    strategies/      DDP, FSDP, DeepSpeed, tensor parallel behind one Strategy interface

Nothing here imports the launcher or the faces.
"""
