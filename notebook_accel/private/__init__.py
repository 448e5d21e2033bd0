"""What notebook_accel relies on that no other project promised: their private names.

One module per project, each name behind a small function whose docstring says what it
relies on (the attribute, the module, the behaviour) and since when that holds:

    cpython.py     multiprocessing's forkserver internals (the zygote adopts its slot), its
                   fd-passing pickler and finalizer registry; asyncio's running loop
    torch.py       torch.distributed's rendezvous handlers and process-group world,
                   torch._dynamo's compiled wrapper, nn.Module's children dict, NVML's
                   count, storages, samplers and schedulers' private counters
    torch_xla.py   torch_xla's process pool (its _internal package)
    ray.py         Ray's key-value store, its raylet client, Ray Client's connection flag,
                   the local-only cluster switch
    numpy.py       numpy's array reconstructor (what its pickles name)

Every part of the package may import these (they are the ground); none imports torch, Ray or
numpy until one of its functions is called. A new release that moves a name is fixed here,
once, with a version check and a fallback.
"""
