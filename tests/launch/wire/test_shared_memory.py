"""Captured data and results through shared memory: real workers on CPU/gloo (issue 9).

Buffers of 1 MiB or more travel out of band; these tests use 4 MiB ones. What a launch
copied is read from ``shared_cache_info()``; what is left behind from /proc.
"""

from __future__ import annotations

import contextlib
import gc
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from notebook_accel import (
    ConfigError,
    LaunchTimeoutError,
    SharedMemoryError,
    WorkerDiedError,
    clear_shared_cache,
    debug_launcher,
    set_shared_cache_limit,
    shared_cache_info,
)
from notebook_accel.config import LaunchConfig
from notebook_accel.launch import launch
from notebook_accel.launch.wire.payload import build
from tests.launch.helpers import worker_processes

ROOT = Path(__file__).resolve().parents[3]
MiB = 1 << 20


# What this process already held when a test began: a segment the test's own launches did
# not make (a result another test's object still holds) is not the test's to account for.
_before: set[str] = set()


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    clear_shared_cache()
    gc.collect()
    _before.clear()
    _before.update(_held_by(os.getpid(), _tag(os.getpid())))
    yield
    set_shared_cache_limit(None)
    clear_shared_cache()


def _tag(pid: int) -> str:
    return f"memfd:notebook-accel-{pid}-"


def _held_by(pid: int, tag: str) -> list[str]:
    """The segments with ``tag`` that process ``pid`` holds as fds or maps (name #inode);
    for this process, those it did not hold when the test began."""
    found = []
    with open(f"/proc/{pid}/maps") as maps:  # address, perms, offset, dev, inode, name
        for line in maps:
            if tag in line:
                fields = line.split(maxsplit=5)
                found.append(f"{fields[5].strip()} #{fields[4]}")
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            inode = os.stat(f"/proc/{pid}/fd/{fd}").st_ino
        except OSError:
            continue
        if tag in target:
            found.append(f"{target} #{inode}")
    if pid == os.getpid():
        found = [name for name in found if name not in _before]
    return found


def _holders(tag: str) -> dict[int, list[str]]:
    """Every process on the machine that holds a segment with ``tag``."""
    holders = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                held = _held_by(int(entry), tag)
            except OSError:
                continue  # ended meanwhile, or not ours to read
            if held:
                holders[int(entry)] = held
    return holders


def _mine() -> list[str]:
    gc.collect()  # a result's last reference may sit in a cycle
    return _held_by(os.getpid(), _tag(os.getpid()))


def _nothing_left() -> None:
    """No worker, and no segment anywhere, once the cache is cleared."""
    assert worker_processes() == []
    gc.collect()
    assert not any("results" in name for name in _mine()), _mine()
    clear_shared_cache()
    assert _holders(_tag(os.getpid())) == {}


# -- copy-on-write ---------------------------------------------------------------------------


def test_a_worker_writing_its_copy_changes_neither_the_notebook_nor_the_other_worker() -> None:
    x = torch.arange(MiB, dtype=torch.float32)  # 4 MiB
    a = np.arange(MiB, dtype=np.float32)
    data = torch.utils.data.TensorDataset(torch.ones(MiB), torch.zeros(MiB, dtype=torch.int32))
    model = torch.nn.Linear(1024, 1024)  # 4 MiB of weights
    weight = model.weight.detach().clone()

    def write_then_read() -> list[float]:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            x.add_(100)
            a[:] = -1
            data.tensors[0].mul_(5)
            with torch.no_grad():
                model.weight.zero_()
        dist.barrier()  # rank 0 has written before rank 1 reads
        return [x[7].item(), float(a[7]), data[3][0].item(), model.weight.abs().sum().item()]

    results = debug_launcher(write_then_read, num_processes=2)
    assert results[0] == [107.0, -1.0, 5.0, 0.0]
    assert results[1] == [7.0, 7.0, 1.0, pytest.approx(weight.abs().sum().item())]
    assert x[7].item() == 7.0 and a[7] == 7.0 and data[3][0].item() == 1.0
    assert torch.equal(model.weight, weight)


def test_views_of_one_storage_travel_once_and_stay_views() -> None:
    x = torch.zeros(4, MiB // 4)
    row = x[1]
    before = shared_cache_info().copied_bytes

    def write_through_the_view() -> float:
        row.fill_(3)
        return x.sum().item()

    assert debug_launcher(write_through_the_view, num_processes=2) == [3.0 * (MiB // 4)] * 2
    assert shared_cache_info().copied_bytes - before == x.nbytes
    assert x.sum().item() == 0.0


# -- the cache -------------------------------------------------------------------------------


def test_a_relaunch_with_unchanged_data_copies_nothing() -> None:
    x = torch.randn(MiB)
    a = np.random.default_rng(0).random(MiB // 2)  # 4 MiB of float64
    model = torch.nn.Linear(1024, 1024)

    def read() -> float:
        return x[0].item() + float(a[0]) + model.weight[0, 0].item()

    expected = x[0].item() + float(a[0]) + model.weight[0, 0].item()
    base = shared_cache_info().copied_bytes
    assert debug_launcher(read, num_processes=2) == [pytest.approx(expected)] * 2
    first = shared_cache_info()
    assert first.copied_bytes - base == x.nbytes + a.nbytes + model.weight.nbytes
    assert debug_launcher(read, num_processes=2) == [pytest.approx(expected)] * 2
    again = shared_cache_info()
    assert again.copied_bytes == first.copied_bytes
    assert again.reused_bytes - first.reused_bytes == first.copied_bytes - base


def test_in_place_changes_in_the_notebook_reach_the_next_launch() -> None:
    x = torch.zeros(MiB)
    a = np.zeros(MiB, dtype=np.float32)
    model = torch.nn.Linear(1024, 1024)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)

    def read() -> tuple[float, float, float]:
        return x[5].item(), float(a[5]), model.weight[0, 0].item()

    assert debug_launcher(read, num_processes=2)[1] == (0.0, 0.0, model.weight[0, 0].item())
    copied = shared_cache_info().copied_bytes
    x[5] = 2.0  # item assignment
    a[5] = 3.0
    model.weight.grad = torch.ones_like(model.weight)
    optimizer.step()  # an in-place update of the parameter
    assert debug_launcher(read, num_processes=2)[1] == (2.0, 3.0, model.weight[0, 0].item())
    # Only what changed was copied again.
    assert shared_cache_info().copied_bytes - copied == x.nbytes + a.nbytes + model.weight.nbytes


def test_buffers_of_several_chunks_are_copied_and_compared_whole() -> None:
    """Past 16 MiB, copies and comparisons run in chunks on several threads."""
    x = torch.arange(10 * MiB, dtype=torch.float32)  # 40 MiB
    a = np.arange(5 * MiB, dtype=np.float64)  # 40 MiB

    def read() -> tuple[float, float, float, torch.Tensor]:
        return x.double().sum().item(), float(a.sum()), float(a[-1]), x * 2

    expected = (x.double().sum().item(), float(a.sum()))
    base = shared_cache_info().copied_bytes
    first = debug_launcher(read, num_processes=2)[1]
    assert first[:3] == (*expected, 5 * MiB - 1.0)
    assert torch.equal(first[3], x * 2)  # a 40 MiB result, written in chunks too
    assert shared_cache_info().copied_bytes - base == x.nbytes + a.nbytes
    a[-1] = -1.0  # in the last chunk only
    assert debug_launcher(read, num_processes=2)[1][2] == -1.0
    assert shared_cache_info().copied_bytes - base == x.nbytes + 2 * a.nbytes


def _data_segments() -> int:
    """How many data segments (memfds of captured copies) this process holds or maps."""
    return len({name.rsplit("#", 1)[1] for name in _mine() if "-data" in name})


def test_large_captured_data_is_copied_in_stripes_and_mapped_whole_copy_on_write() -> None:
    """From 64 MiB a launch's new copies are cut into stripes, one segment each, written a
    thread each; every worker maps them side by side, copy-on-write, as one region."""
    from notebook_accel.hardware import usable_cores

    x = torch.arange(10 * MiB, dtype=torch.float64)  # 80 MiB
    a = np.arange(3 * MiB + 5, dtype=np.int64)  # across a stripe's end
    small = torch.arange(MiB + 3, dtype=torch.int32)  # odd-sized, last

    def use() -> list[float]:
        rank = int(os.environ["RANK"])
        seen = [x[-1].item(), float(a[-1]), float(a.sum()), small[-1].item()]
        x.add_(rank + 1)  # each worker's own copy
        a[:] = -rank
        return [*seen, x[-1].item(), float(a[0]), float(a[-1])]

    base = shared_cache_info().copied_bytes
    results = debug_launcher(use, num_processes=2)
    last_x = float(10 * MiB - 1)
    sum_a = float((3 * MiB + 5) * (3 * MiB + 4) // 2)
    for rank, seen in enumerate(results):
        assert seen == [last_x, 3 * MiB + 4.0, sum_a, MiB + 2.0, last_x + rank + 1, -rank, -rank]
    assert _data_segments() == min(4, usable_cores())  # the launch's copies, in stripes
    assert x[-1].item() == last_x and a[0] == 0  # the notebook's data: untouched
    copied = shared_cache_info().copied_bytes - base
    assert copied == x.nbytes + a.nbytes + small.nbytes
    again = debug_launcher(use, num_processes=2)  # the cached copies, unchanged by the writes
    assert [seen[:4] for seen in again] == [results[0][:4]] * 2
    assert shared_cache_info().copied_bytes - base == copied
    a[-1] = 7  # in the notebook: compared through the stripes, seen
    assert debug_launcher(use, num_processes=2)[0][1] == 7.0


def test_device_memory_is_filled_through_the_striped_mapping() -> None:
    """A buffer without a host view (a GPU's: copied by its fill function) is written through
    the notebook's mapping of the stripes, each stripe's region taken first. No GPU here: the
    fill function stands in for the device copy."""
    from notebook_accel.launch.wire.pickling import Outgoing
    from notebook_accel.launch.wire.shm import SharedCache

    source = np.random.default_rng(0).integers(0, 255, 70 * MiB + 11, dtype=np.uint8)

    def fill(destination: memoryview) -> None:
        destination[:] = source.data

    device = Outgoing(source.nbytes, None, ("device", 1, source.nbytes), fill=fill)
    host = np.arange(MiB, dtype=np.float64)
    host_out = Outgoing(host.nbytes, memoryview(host).cast("B"), ("host", 2, host.nbytes))
    cache = SharedCache()
    shipment = cache.ship([host_out, device], results=False)
    try:
        views = shipment.views()
        assert np.array_equal(np.frombuffer(views[0], dtype=np.float64), host)
        assert np.array_equal(np.frombuffer(views[1], dtype=np.uint8), source)
        del views
    finally:
        shipment.release()
        cache.clear()


def test_a_launch_passes_at_most_64_segment_fds_whatever_the_cache_holds() -> None:
    """Data cached by 70 launches, in 70 segments, captured by one: the smallest old segments'
    copies are copied again into the launch's new one, so each worker gets at most 64 data
    segments' fds (and one message of fds stays under the kernel's 253)."""
    from notebook_accel.launch.wire.pickling import dumps
    from notebook_accel.launch.wire.shm import MAX_SEGMENT_FDS, transport

    arrays = [np.full(MiB // 8, float(n)) for n in range(70)]
    for array in arrays:  # one launch's worth each: a segment each
        transport().ship(dumps(array, placement="local").buffers, results=False).release()
    assert shared_cache_info().segments == 70

    def total() -> tuple[float, int]:
        segments = set()  # the data segments passed (Python's mmap keeps a dup of each fd)
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if "-data" in os.readlink(f"/proc/self/fd/{fd}"):
                    segments.add(os.stat(f"/proc/self/fd/{fd}").st_ino)
        return sum(float(a[-1]) for a in arrays), len(segments)

    for value, segments in debug_launcher(total, num_processes=2):
        assert value == float(sum(range(70)))
        assert 0 < segments <= MAX_SEGMENT_FDS
    assert shared_cache_info().segments <= MAX_SEGMENT_FDS


def test_the_limit_evicts_least_recently_used_copies() -> None:
    first, second = torch.ones(MiB), torch.full((MiB,), 2.0)
    set_shared_cache_limit(6 * MiB)  # room for one 4 MiB copy
    assert debug_launcher(lambda: first.sum().item(), num_processes=2) == [float(MiB)] * 2
    assert debug_launcher(lambda: second.sum().item(), num_processes=2) == [2.0 * MiB] * 2
    assert shared_cache_info().entries == 1
    copied = shared_cache_info().copied_bytes
    debug_launcher(lambda: second.sum().item(), num_processes=2)
    assert shared_cache_info().copied_bytes == copied  # the recent one stayed
    set_shared_cache_limit(0)
    assert shared_cache_info().entries == 0
    assert _mine() == []


def test_a_deleted_tensor_leaves_the_cache_at_the_next_launch() -> None:
    data = {"x": torch.ones(MiB)}
    debug_launcher(lambda x: x.sum().item(), args=(data["x"],), num_processes=2)
    assert shared_cache_info().entries == 1
    del data["x"]
    debug_launcher(lambda: 1, num_processes=2)
    assert shared_cache_info().entries == 0


def test_a_bad_limit_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="limit"):
        set_shared_cache_limit(1.5)
    with pytest.raises(ConfigError, match="limit"):
        set_shared_cache_limit("8G")  # type: ignore[arg-type]


def test_the_preflight_pickle_is_the_one_that_travels() -> None:
    x = torch.randn(4 * MiB)  # 16 MiB

    def read() -> float:
        return x[0].item()

    payload, buffers = build(read, (), None, {})
    assert len(payload.call) < 64 * 1024  # the tensor's bytes are not in the pickle
    assert [b.nbytes for b in buffers] == [x.nbytes]
    base = shared_cache_info().copied_bytes
    assert debug_launcher(read, num_processes=2) == [x[0].item()] * 2
    assert shared_cache_info().copied_bytes - base == x.nbytes  # once, for every worker


# -- results ---------------------------------------------------------------------------------


def test_large_results_come_back_and_end_with_their_last_reference() -> None:
    def make() -> dict[str, Any]:
        rank = int(os.environ["RANK"])
        model = torch.nn.Linear(1024, 1024)
        with torch.no_grad():
            model.weight.fill_(rank)
        return {"state": model.state_dict(), "array": np.full(MiB, rank, dtype=np.float32)}

    results = debug_launcher(make, num_processes=2)
    assert [r["state"]["weight"].mean().item() for r in results] == [0.0, 1.0]
    assert [float(r["array"][-1]) for r in results] == [0.0, 1.0]
    results[1]["state"]["weight"].add_(1)  # the notebook owns them: writable
    assert results[1]["state"]["weight"][0, 0].item() == 2.0
    assert any("results" in name for name in _mine())
    del results
    gc.collect()
    assert not any("results" in name for name in _mine())


def _results_blocks() -> dict[int, int]:
    """This process's results segments (open fds): inode -> bytes of memory they hold."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        path = f"/proc/self/fd/{fd}"
        try:
            if "results" in os.readlink(path) and _tag(os.getpid()) in os.readlink(path):
                status = os.stat(path)
                found[status.st_ino] = status.st_blocks * 512
        except OSError:
            continue
    return found


def test_a_large_result_is_written_in_stripes_and_read_as_one_buffer() -> None:
    """Results of 64 MiB or more are cut into stripes, one segment each (a thread per
    segment in the rank), mapped side by side in the notebook: the buffers inside, whatever
    stripes they span, read back exactly; dropping one rank's value frees its memory."""
    from notebook_accel.hardware import usable_cores

    def make() -> dict[str, Any]:
        rank = int(os.environ["RANK"])
        return {
            "a": torch.arange(20 * MiB, dtype=torch.float32) + rank,  # 80 MiB
            "b": np.arange(3 * MiB + 5, dtype=np.int64) * (rank + 1),  # spans a stripe's end
            "c": torch.full((7,), rank),  # small: in the pickle
            "d": torch.arange(MiB + 3, dtype=torch.int16) - rank,  # odd-sized, last
        }

    results = debug_launcher(make, num_processes=2)
    for rank, value in enumerate(results):
        assert torch.equal(value["a"], torch.arange(20 * MiB, dtype=torch.float32) + rank)
        assert np.array_equal(value["b"], np.arange(3 * MiB + 5, dtype=np.int64) * (rank + 1))
        assert value["c"].tolist() == [rank] * 7
        assert torch.equal(value["d"], torch.arange(MiB + 3, dtype=torch.int16) - rank)
    del value
    stripes = _results_blocks()
    assert len(stripes) == min(4, usable_cores())  # one segment per copying thread
    mapped = {name for name in _mine() if "results" in name and "(deleted) #" in name}
    assert len({name.rsplit("#", 1)[1] for name in mapped}) == len(stripes)  # all mapped
    results[1]["a"].add_(1)  # the notebook owns them: writable
    assert results[1]["a"][:2].tolist() == [2.0, 3.0]
    held = sum(stripes.values())
    assert held >= 2 * (80 + 24 + 2) * MiB
    results[1] = None  # rank 1's region: its holes punched, rank 0's stays
    gc.collect()
    left = sum(_results_blocks().values())
    assert held - left >= (80 + 24 + 2) * MiB
    assert torch.equal(results[0]["a"], torch.arange(20 * MiB, dtype=torch.float32))
    del results
    gc.collect()
    assert not any("results" in name for name in _mine())


# -- nothing left behind ---------------------------------------------------------------------


def _ending(how: str) -> Any:
    x = torch.ones(MiB)

    def train() -> Any:
        rank = int(os.environ["RANK"])
        if rank == 0:
            return torch.full((MiB,), x[0].item())  # a large result, written before the end
        time.sleep(0.5)
        if how == "exception":
            raise ValueError("rank 1 failed")
        if how == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        if how in ("timeout", "interrupt"):
            time.sleep(60)
        return x.sum().item()

    return train


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("normal", None),
        ("exception", ValueError),
        ("killed", WorkerDiedError),
        ("timeout", LaunchTimeoutError),
        ("interrupt", KeyboardInterrupt),
    ],
)
def test_no_segment_is_left_after_any_ending(how: str, error: type[BaseException] | None) -> None:
    stop = threading.Event()
    if how == "interrupt":  # the launch panel's stop button: a KeyboardInterrupt in the cell
        threading.Timer(3.0, stop.set).start()
    timeout = 4.0 if how == "timeout" else None
    config = LaunchConfig(num_processes=2, hardware="cpu", timeout=timeout)
    if error is None:
        results = launch(_ending(how), (), None, config, stop=stop)
        assert results[1] == float(MiB)
        del results
    else:
        with pytest.raises(error):
            launch(_ending(how), (), None, config, stop=stop)
    _nothing_left()


_KERNEL = textwrap.dedent("""
    import os, sys, time, torch
    from notebook_accel import debug_launcher
    x = torch.ones(1 << 20)
    def train():
        print(os.getpid(), x.sum().item(), flush=True)
        time.sleep(120)
    debug_launcher(train, num_processes=2)
""")


def test_a_killed_kernel_leaves_no_segment_and_no_worker() -> None:
    kernel = subprocess.Popen(
        [sys.executable, "-c", _KERNEL], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert kernel.stdout is not None
    pids = []
    while len(pids) < 2:
        line = kernel.stdout.readline()
        if line.startswith("[rank"):
            pids.append(int(line.split()[-2]))
    tag = _tag(kernel.pid)
    assert set(_holders(tag)) >= {kernel.pid, *pids}  # the workers map the kernel's segment
    kernel.kill()
    kernel.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _holders(tag):
        time.sleep(0.1)
    assert _holders(tag) == {}


# -- memory limits ---------------------------------------------------------------------------

_TINY_SHM = textwrap.dedent("""
    import json, os, torch
    from notebook_accel import debug_launcher, shared_cache_info
    shm = os.statvfs("/dev/shm")
    x = torch.ones(32 << 20, dtype=torch.uint8)  # 32 MiB, four times /dev/shm
    def train():
        return x.sum().item(), torch.full((16 << 20,), 2, dtype=torch.uint8)
    results = debug_launcher(train, num_processes=2)
    print(json.dumps({
        "shm_bytes": shm.f_blocks * shm.f_frsize,
        "sums": [r[0] for r in results],
        "returned": [r[1].sum().item() for r in results],
        "copied": shared_cache_info().copied_bytes,
    }))
""")


def test_a_tiny_dev_shm_does_not_matter() -> None:
    """Docker's default /dev/shm is 64 MB; here it is 8 MB, in a private mount namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    command = 'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$0" -c "$1"'
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", command, sys.executable, _TINY_SHM],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    if done.returncode != 0 and "mount" in done.stderr + done.stdout and "{" not in done.stdout:
        pytest.skip(f"cannot mount a private /dev/shm here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["shm_bytes"] == 8 * MiB
    assert report["sums"] == [32 * MiB] * 2
    assert report["returned"] == [2 * 16 * MiB] * 2
    assert report["copied"] == 32 * MiB


def _bigger_than_memory() -> tuple[np.ndarray, mmap.mmap]:
    """A read-only array over a sparse file larger than the machine's memory (no RAM used)."""
    size = 4 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with tempfile.TemporaryFile() as file:
        file.truncate(size)
        region = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
    return np.frombuffer(region, dtype=np.uint8), region


def test_captured_data_larger_than_memory_is_a_clear_error_before_any_worker() -> None:
    huge, _region = _bigger_than_memory()

    def read() -> int:
        return int(huge[0])

    with pytest.raises(SharedMemoryError) as info:
        debug_launcher(read, num_processes=2)
    assert info.value.needed >= huge.nbytes > info.value.available
    assert f"{huge.nbytes / (1 << 30):.2f} GiB" in str(info.value)
    assert "the data captured by the launched function" in str(info.value)
    assert worker_processes() == []
    del info
    _nothing_left()


def test_a_container_s_limit_is_shared_memory_s_budget(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The container (a cgroup v2 folder written here) has 8 MiB left of its 1 GiB, whatever
    # the machine has: a launch capturing 16 MiB is refused before any worker starts.
    folder = tmp_path / "cgroup"
    folder.mkdir()
    (folder / "memory.max").write_text(f"{1 << 30}\n")
    (folder / "memory.current").write_text(f"{(1 << 30) - 8 * MiB}\n")
    (folder / "memory.stat").write_text("inactive_file 0\n")
    monkeypatch.setenv("NOTEBOOK_ACCEL_CGROUP", str(folder))
    data = np.ones(2 * MiB)  # 16 MiB

    def read() -> float:
        return float(data[0])

    with pytest.raises(SharedMemoryError) as info:
        debug_launcher(read, num_processes=2)
    assert info.value.available == 8 * MiB < info.value.needed
    assert worker_processes() == []
    del info
    _nothing_left()


def test_a_result_larger_than_memory_is_a_clear_error() -> None:
    def make() -> np.ndarray:
        return _bigger_than_memory()[0]

    with pytest.raises(SharedMemoryError, match="the value returned by this rank needs"):
        debug_launcher(make, num_processes=2)
    _nothing_left()


def test_pandas_frames_travel_out_of_band() -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": np.arange(MiB, dtype=np.float64), "b": np.ones(MiB)})

    def total() -> float:
        frame["a"] += 1  # the worker's own copy
        return float(frame["a"].sum() + frame["b"].sum())

    expected = float(frame["a"].sum() + MiB + frame["b"].sum())
    assert debug_launcher(total, num_processes=2) == [expected] * 2
    assert shared_cache_info().copied_bytes >= 2 * 8 * MiB
    assert float(frame["a"][0]) == 0.0


# -- the TPU path's process pool -------------------------------------------------------------


def _load_twice_and_pack(payload: Any) -> Any:
    """What torch_xla's pool does with the payload: one process, a thread per device."""
    from notebook_accel.launch.wire.payload import load
    from notebook_accel.launch.wire.transport import pack

    values = []
    for _ in range(2):  # each device gets its own copy of the captured data
        function, args, kwargs = load(payload)
        values.append(function(*args, **kwargs))
    return pack(payload.shipment, values)


def test_a_spawned_process_pool_gets_the_segments_as_torch_xla_s_does() -> None:
    """xla/engine.py hands the payload to torch_xla's pool (spawn); the fds go by the resource
    sharer."""
    import dataclasses
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from notebook_accel.launch.wire.shm import shipped
    from notebook_accel.launch.wire.transport import unpack

    x = torch.zeros(MiB)

    def bump() -> torch.Tensor:
        x.add_(1)
        return x.clone()  # 4 MiB: back through shared memory

    payload, buffers = build(bump, (), None, {})
    with shipped(buffers) as shipment:
        payload = dataclasses.replace(payload, shipment=shipment)
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(2, mp_context=spawn) as pool:
            futures = [pool.submit(_load_twice_and_pack, payload) for _ in range(2)]
            results = [unpack(shipment, future.result(timeout=120)) for future in futures]
    assert [[v.sum().item() for v in values] for values in results] == [[float(MiB)] * 2] * 2
    assert x.sum().item() == 0.0
    del results
    _nothing_left()
