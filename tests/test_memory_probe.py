"""The one memory probe (notebook_accel/memory_probe.py) sees the container: its cgroup's
limit (v1 or v2, on it or above it) and what its processes already use, read from a cgroup
folder written here (``NOTEBOOK_ACCEL_CGROUP``) or found through /proc. Shared memory's
budget, the shared cache's default limit and a device map's CPU budget follow it."""

from __future__ import annotations

from pathlib import Path

import pytest

from notebook_accel import env
from notebook_accel.memory_probe import (
    available_memory,
    container_limits,
    memory_folder,
    total_memory,
)

MiB = 1 << 20


def v2(folder: Path, limit: int | None, current: int, inactive_file: int = 0) -> Path:
    """A cgroup v2 folder as the kernel shows it (``max``: no limit)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.max").write_text("max\n" if limit is None else f"{limit}\n")
    (folder / "memory.current").write_text(f"{current}\n")
    (folder / "memory.stat").write_text(f"anon {current}\ninactive_file {inactive_file}\n")
    return folder


def v1(folder: Path, limit: int, usage: int, inactive_file: int = 0) -> Path:
    """A cgroup v1 memory folder: its own limit unset, the one above it in the hierarchy."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (folder / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (folder / "memory.stat").write_text(
        f"cache 0\nrss {usage}\nhierarchical_memory_limit {limit}\n"
        f"total_inactive_file {inactive_file}\n"
    )
    return folder


@pytest.fixture
def cgroup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process's memory cgroup is a folder of the test's (filled by the test)."""
    folder = tmp_path / "sys" / "fs" / "cgroup" / "kernel"
    monkeypatch.setenv(env.CGROUP_VARIABLE, str(folder))
    return folder


def test_a_v2_limit_bounds_total_and_available(cgroup: Path) -> None:
    v2(cgroup, limit=512 * MiB, current=300 * MiB, inactive_file=100 * MiB)
    assert total_memory() == 512 * MiB
    # What it uses, less the file cache it could drop: 200 MiB; 312 MiB left.
    assert available_memory() == 312 * MiB


def test_a_v2_limit_above_this_cgroup_counts_with_its_own_use(cgroup: Path) -> None:
    v2(cgroup.parent, limit=256 * MiB, current=200 * MiB)  # a sibling uses memory too
    v2(cgroup, limit=None, current=50 * MiB)
    [limit] = container_limits()
    assert limit.folder == cgroup.parent
    assert total_memory() == 256 * MiB
    assert available_memory() == 56 * MiB


def test_a_v1_hierarchical_limit_is_read(cgroup: Path) -> None:
    v1(cgroup, limit=1024 * MiB, usage=400 * MiB, inactive_file=50 * MiB)
    assert total_memory() == 1024 * MiB
    assert available_memory() == 674 * MiB


def test_no_limit_is_the_machine(cgroup: Path) -> None:
    v2(cgroup, limit=None, current=50 * MiB)
    machine = dict(line.split(":")[0:2] for line in Path("/proc/meminfo").read_text().splitlines())
    assert container_limits() == []
    assert total_memory() == int(machine["MemTotal"].split()[0]) * 1024
    assert 0 < available_memory() <= total_memory()


@pytest.mark.parametrize(
    ("cgroup", "mountinfo", "folder"),
    [
        (  # v2 with a cgroup namespace: the container is the hierarchy's root
            "0::/\n",
            "35 30 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
            "/sys/fs/cgroup",
        ),
        (  # v2 on a host: a slice
            "0::/user.slice/user-1000.slice/session-2.scope\n",
            "35 30 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n",
            "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope",
        ),
        (  # v1 (and a v2 hierarchy without the memory controller beside it)
            "4:memory:/process_api/e53a\n2:cpu,cpuacct:/\n0::/\n",
            "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
            "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
            "/sys/fs/cgroup/memory/process_api/e53a",
        ),
        (  # v1 in Docker without a cgroup namespace: the mount's root is the container's
            "9:memory:/docker/0a1b\n",
            "612 603 0:40 /docker/0a1b /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
            "/sys/fs/cgroup/memory",
        ),
        ("0::/\n", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n", None),  # none mounted
    ],
)
def test_this_process_s_cgroup_is_found_through_proc(
    cgroup: str, mountinfo: str, folder: str | None
) -> None:
    found = memory_folder(cgroup, mountinfo)
    assert (None if found is None else str(found)) == folder


def test_this_machine_s_own_cgroup_is_read() -> None:
    # Whatever this machine has (v1, v2 or none): read without error, and consistent.
    assert 0 < available_memory() <= total_memory()
    for limit in container_limits():
        assert limit.folder.is_dir() and limit.limit >= total_memory()


def test_a_device_map_s_cpu_budget_follows_the_container(cgroup: Path) -> None:
    from notebook_accel.utils import compute_module_sizes, get_max_memory, infer_auto_device_map
    from tests.big_model.test_device_map import gpt2

    model = gpt2()
    size = compute_module_sizes(model)[""]
    v2(cgroup, limit=10 * size, current=10 * size - size // 2)  # half the model is left
    assert get_max_memory() == {"cpu": size // 2}
    device_map = infer_auto_device_map(model)
    assert set(device_map.values()) == {"cpu", "disk"}  # the rest goes to disk
    v2(cgroup, limit=None, current=0)
    assert infer_auto_device_map(model) == {"": "cpu"}


def test_the_shared_cache_s_default_limit_follows_the_container(cgroup: Path) -> None:
    from notebook_accel.launch.wire.shm import DEFAULT_SHARE, SharedCache

    v2(cgroup, limit=400 * MiB, current=0)
    assert SharedCache().limit == int(400 * MiB * DEFAULT_SHARE)
