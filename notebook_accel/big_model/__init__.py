"""Big models in pieces: accelerate's ``big_modeling`` and ``hooks``, written for this package.

A part of its own (it stands on the ground only): loading a model too big for one device
needs no Accelerator, no process group and no launcher, and a launch's rank uses it as any
script does.

    empty.py        init_empty_weights, init_on_device: parameters made on the meta device
    tensors.py      one tensor of a module set on a device; sizes, ties, size strings
    memory.py       get_max_memory, get_balanced_memory: the budgets a device map fills
    device_map.py   infer_auto_device_map: blocks to GPU ids, then "cpu", then "disk"
    offload.py      weights kept off the model: a folder of safetensors files, read on use
    moves.py        send_to_device: tensors inside nested inputs and outputs moved
    hooks.py        ModelHook, AlignDevicesHook, CpuOffload: forward wrapped to move weights
    dispatch.py     dispatch_model, cpu_offload(_with_hook), disk_offload
    loading.py      load_checkpoint_in_model, load_checkpoint_and_dispatch (shards + index)
"""
