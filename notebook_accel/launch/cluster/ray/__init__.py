"""A Ray cluster as a launch backend, imported only when a launch asks for ``cluster="ray"``.

driver.py     in the notebook: RayBackend (placement group, one streaming task per rank,
              supervision, the ending), connect, describe_cluster, keep_warm
parking.py    the finished ranks' workers kept busy (0-CPU holds) until the next launch
ranks.py      in the cluster: a rank's task (and Ray Client's actor) running the function
shipment.py   large buffers through Ray's object store (the transport seam)
store.py      the TCPStore rank 0's task hosts on its node
local.py      a stand-in cluster on 127.0.0.1 (notebooks, tests, benchmarks)
"""
