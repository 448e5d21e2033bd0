"""notebook_launcher(cluster="ray") on a real local Ray cluster: two nodes on 127.0.0.1.

One cluster serves the whole module (starting one takes a while on two cores); the test that
kills a node runs last.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from notebook_accel import notebook_launcher
from notebook_accel.errors import ConfigError, LaunchTimeoutError, RemoteTraceback
from notebook_accel.launch import launch
from notebook_accel.launch.cluster.ray.local import local_cluster
from notebook_accel.launch.show.display import Display
from notebook_accel.reporting.channel import Health, Progress
from tests.browser import free_port
from tests.launch.stalls import Recorder, line_of, mismatched, note_of, times_out_with_a_note

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(600)

# Ray notices a dead node after its health check; the default (tens of seconds) is long for a test.
_FAST_HEALTH_CHECK = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
}


@pytest.fixture(scope="module")
def cluster() -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("RAY_ADDRESS", raising=False)
        local = local_cluster(num_nodes=2, num_cpus=2, system_config=_FAST_HEALTH_CHECK)
        try:
            ray.init(address=local.address, log_to_driver=False)
            yield local
        finally:
            ray.shutdown()
            local.shutdown()


def _all_free(timeout: float = 10.0) -> bool:
    """Every CPU is available again and no placement group is left."""
    from ray.util import placement_group_table

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        free = ray.available_resources().get("CPU", 0) == ray.cluster_resources().get("CPU")
        groups = [g for g in placement_group_table().values() if g["state"] != "REMOVED"]
        if free and not groups:
            return True
        time.sleep(0.2)
    return False


def _train(steps: int) -> dict[str, Any]:
    import os

    import ray as ray_in_rank
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)  # each rank its own data
    for _ in range(steps):
        x = torch.randn(8, 4, generator=generator)
        loss = ddp(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    return {
        "rank": rank,
        "world": dist.get_world_size(),
        "sum": total.item(),
        "weights": [p.detach().tolist() for p in model.parameters()],
        "node": ray_in_rank.get_runtime_context().get_node_id(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "node_rank": int(os.environ["GROUP_RANK"]),
    }


def test_four_ranks_on_two_nodes_train_to_identical_weights(cluster: Any) -> None:
    results = notebook_launcher(
        _train, args=(5,), num_processes=4, cluster="ray", placement_strategy="SPREAD"
    )
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert {r["world"] for r in results} == {4}
    assert {r["sum"] for r in results} == {6.0}
    assert all(r["weights"] == results[0]["weights"] for r in results)
    assert len({r["node"] for r in results}) == 2  # SPREAD: both nodes
    # Each node's ranks are contiguous, rank 0's node first, local ranks count from 0.
    assert [r["node_rank"] for r in results] == [0, 0, 1, 1]
    assert [r["local_rank"] for r in results] == [0, 1, 0, 1]
    assert _all_free()


def _pid_and_leak() -> tuple[int, str | None]:
    import os

    leaked = os.environ.get("NOTEBOOK_ACCEL_TEST_LEAK")
    os.environ["NOTEBOOK_ACCEL_TEST_LEAK"] = "set by an earlier launch"
    print("some output")
    return os.getpid(), leaked


def test_a_launch_right_after_another_reuses_its_worker_processes(cluster: Any) -> None:
    # The ranks are Ray tasks: a finished rank's worker process (torch imported) goes back to
    # Ray's pool and the next launch's rank runs in it, with its environment as it was.
    first = notebook_launcher(_pid_and_leak, num_processes=4, cluster="ray", output="none")
    second = notebook_launcher(_pid_and_leak, num_processes=4, cluster="ray", output="none")
    assert {pid for pid, _ in second} == {pid for pid, _ in first}
    assert all(leaked is None for _, leaked in first + second)
    assert _all_free()


# Ray's idle-worker policy, at its defaults (the cluster here sets neither): a node's idle
# workers beyond its free CPUs are ended once idle over idle_worker_killing_time_threshold_ms,
# and its raylet looks every kill_idle_workers_interval_ms.
_IDLE_LIMIT = 1.0
_IDLE_LOOK = 0.2


def test_warm_workers_outlast_ray_s_idle_limit_while_the_cpus_are_reserved(cluster: Any) -> None:
    # A launch's placement group takes its nodes' CPUs a moment before its ranks reach them;
    # idle warm workers past Ray's limit were ended in that moment. Here the CPUs stay
    # reserved for a few of Ray's looks after the limit has passed: the finished ranks'
    # workers, parked busy with a 0-CPU task, are spared, and the next launch runs in them.
    from ray.util.placement_group import placement_group, remove_placement_group

    first = notebook_launcher(_pid_and_leak, num_processes=4, cluster="ray", output="none")
    pids = {pid for pid, _ in first}
    time.sleep(_IDLE_LIMIT + _IDLE_LOOK)
    assert _all_free()  # parked by now: no CPU or placement group held
    group = placement_group([{"CPU": 1}] * 4)  # every CPU of both nodes
    try:
        ray.get(group.ready(), timeout=60)
        time.sleep(3 * _IDLE_LOOK)  # idle, they would be ended here (the test fails so)
    finally:
        remove_placement_group(group)
    assert _all_free()
    second = notebook_launcher(_pid_and_leak, num_processes=4, cluster="ray", output="none")
    assert {pid for pid, _ in second} == pids
    assert all(leaked is None for _, leaked in second)


def _save_once(folder: str) -> int:
    import os

    import torch

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    del model
    accelerator.save_state(os.path.join(folder, "checkpoint"))
    accelerator.end_training()
    return accelerator.process_index


def test_checkpoints_pair_up_when_only_some_ranks_reuse_a_process(
    cluster: Any, tmp_path: Path
) -> None:
    # save_state pairs the ranks' saves by counting them; a rank whose process saved in an
    # earlier launch must count from zero like a rank in a fresh process.
    first = tmp_path / "first"
    assert notebook_launcher(
        _save_once, args=(str(first),), num_processes=2, cluster="ray", timeout=120
    ) == [0, 1]
    second = tmp_path / "second"
    assert notebook_launcher(
        _save_once, args=(str(second),), num_processes=4, cluster="ray", timeout=120
    ) == [0, 1, 2, 3]
    assert (second / "checkpoint").is_dir()


def _ray_workers(title: bytes) -> set[int]:
    """Ray worker processes whose title starts so: b"ray::IDLE" waits in a pool, b"ray::hold"
    is a parked worker."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if Path(f"/proc/{name}/cmdline").read_bytes().startswith(title):
                    found.add(int(name))
            except OSError:
                continue
    return found


def test_keep_warm_starts_idle_workers_on_a_node(cluster: Any) -> None:
    # What a stopped or dead rank's node gets for the next launch: booted workers of this job.
    from notebook_accel.launch.cluster.ray.driver import keep_warm

    node = ray.get_runtime_context().get_node_id()
    before = _ray_workers(b"ray::IDLE")
    keep_warm(ray, {node: 2})
    end = time.monotonic() + 60
    while len(_ray_workers(b"ray::IDLE") - before) < 2 and time.monotonic() < end:
        time.sleep(0.2)
    assert len(_ray_workers(b"ray::IDLE") - before) >= 2


class _Recording(Display):
    def __init__(self) -> None:
        super().__init__(output="all")
        self.bars: list[tuple[int, Progress]] = []
        self.health_seen: list[tuple[int, Health]] = []

    def progress(self, rank: int, message: Progress) -> None:
        self.bars.append((rank, message))

    def health(self, rank: int, message: Health) -> None:
        self.health_seen.append((rank, message))


def _chatty(fail_on: int | None) -> int:
    import os
    import sys

    from notebook_accel import tqdm

    rank = int(os.environ["RANK"])
    print(f"hello from {rank}")
    print(f"to stderr {rank}", file=sys.stderr)
    for _ in tqdm(range(3), desc="steps"):
        pass
    os.system(f"echo from a child process of {rank}")  # C-level writes to fd 1 arrive too
    if rank == fail_on:
        raise ValueError(f"bad value on rank {rank}")
    return rank * 10


def test_output_progress_results_and_error_as_locally(
    cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    display = _Recording()
    config = _config(num_processes=2)
    assert launch(_chatty, (None,), None, config, display=display) == [0, 10]
    out, err = capsys.readouterr()
    for rank in (0, 1):
        assert f"[rank {rank}] hello from {rank}\n" in out
        assert f"[rank {rank}] from a child process of {rank}\n" in out
        assert f"[rank {rank}] to stderr {rank}\n" in err
    assert "pid=" not in out + err  # no Ray log prefixes
    closed = [m for rank, m in display.bars if rank == 0 and m.closed]
    assert closed and closed[-1].n == 3 and closed[-1].desc == "steps"
    assert _all_free()

    # A second launch in a row on the same cluster, one rank raising.
    with pytest.raises(ValueError, match="bad value on rank 1") as raised:
        notebook_launcher(_chatty, args=(1,), num_processes=2, cluster="ray")
    cause = raised.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "_chatty" in str(cause) and "raise ValueError" in str(cause)
    assert raised.value.rank == 1  # type: ignore[attr-defined]
    assert _all_free()


def _log_a_few(n: int) -> int:
    import time

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    for i in range(n):
        accelerator.log({"loss": 1.0 / (i + 1)}, step=i)
    time.sleep(1.5)  # long enough for a health report (one a second)
    accelerator.wait_for_everyone()
    return accelerator.process_index


def test_logged_metrics_and_health_reach_the_notebook(cluster: Any) -> None:
    from notebook_accel import last_metrics

    display = _Recording()
    assert launch(_log_a_few, (5,), None, _config(num_processes=2), display=display) == [0, 1]
    assert last_metrics() == [{"step": i, "loss": 1.0 / (i + 1)} for i in range(5)]
    assert {rank for rank, _ in display.health_seen} == {0, 1}


def test_captured_tensors_and_large_results_travel_through_the_object_store(
    cluster: Any,
) -> None:
    import torch

    data = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB: out of band, not in the pickle

    def use(scale: float) -> tuple[float, Any]:
        import os

        rank = int(os.environ["RANK"])
        data.add_(rank)  # a private copy: neither the notebook's nor the other rank's
        return data.sum().item(), data[: 1 << 19] * scale  # a 2 MiB result

    results = notebook_launcher(use, args=(2.0,), num_processes=2, cluster="ray")
    base = float(sum(range(1 << 20)))
    assert [total for total, _ in results] == [base, base + (1 << 20)]
    assert torch.equal(results[1][1], (torch.arange(1 << 19, dtype=torch.float32) + 1) * 2)
    assert torch.equal(data, torch.arange(1 << 20, dtype=torch.float32))  # untouched here
    assert _all_free()


def _config(**changes: Any) -> Any:
    from notebook_accel.config import LaunchConfig

    return LaunchConfig(cluster="ray", hardware="cpu", **changes)


def _wait_then_sleep(marker: str) -> None:
    from pathlib import Path

    Path(marker, os.environ["RANK"]).write_text("started")
    time.sleep(600)


def test_stop_frees_every_rank_and_the_placement_group(cluster: Any, tmp_path: Path) -> None:
    stop = threading.Event()

    def press_stop() -> None:
        while len(list(tmp_path.iterdir())) < 2:
            time.sleep(0.1)
        stop.set()

    threading.Thread(target=press_stop, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        launch(_wait_then_sleep, (str(tmp_path),), None, _config(num_processes=2), stop=stop)
    assert time.monotonic() - started < 120
    assert _all_free(timeout=10.0)


def test_timeout_stops_the_ranks_and_frees_the_cluster(cluster: Any, tmp_path: Path) -> None:
    with pytest.raises(LaunchTimeoutError):
        notebook_launcher(
            _wait_then_sleep, args=(str(tmp_path),), num_processes=2, cluster="ray", timeout=20
        )
    assert _all_free(timeout=10.0)


def test_command_line_launches_a_script_on_the_cluster(cluster: Any, tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print('rank', dist.get_rank(), 'of', dist.get_world_size(), 'args', sys.argv[1:])\n"
    )
    environ = {**os.environ, "RAY_ADDRESS": cluster.address}
    done = subprocess.run(
        [sys.executable, "-m", "notebook_accel.faces.cli", "launch", "--cluster", "ray"]
        + ["--num_processes", "2", str(script), "--lr", "1"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} of 2 args ['--lr', '1']" in done.stdout
    assert _all_free()


_PARKING_DRIVER = """
import json, os, time
from pathlib import Path

import ray

from notebook_accel import notebook_launcher


def held():
    found = set()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{name}/cmdline").read_bytes().startswith(b"ray::hold"):
                found.add(int(name))
        except OSError:
            pass
    return found


ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
pids = set(notebook_launcher(os.getpid, num_processes=2, cluster="ray", output="none"))
end = time.monotonic() + 60
while time.monotonic() < end and not pids <= held():
    time.sleep(0.1)
print(json.dumps(sorted(pids & held())))
"""


def test_parked_workers_end_with_their_job(cluster: Any) -> None:
    # Between launches the ranks' workers wait busy in 0-CPU holds (nothing reserved); a
    # notebook that ends (here a driver process that parked two and exits) takes them along.
    import json
    import subprocess
    import sys

    environ = {**os.environ, "RAY_ADDRESS": cluster.address}
    done = subprocess.run(
        [sys.executable, "-c", _PARKING_DRIVER],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    parked = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert len(parked) == 2  # both ranks' workers were parked when it exited
    end = time.monotonic() + 30
    while parked & _ray_workers(b"ray::hold") and time.monotonic() < end:
        time.sleep(0.2)
    assert not parked & _ray_workers(b"ray::hold")
    assert _all_free()


@pytest.fixture
def client_server(cluster: Any) -> Any:
    """A Ray Client server for the cluster on 127.0.0.1; yields its port.

    Its single-process ("legacy") mode: the default proxy mode starts a server per client,
    and that start failed about one time in three on this machine, in Ray itself.
    """
    import socket
    import subprocess
    import sys

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "ray.util.client.server", "--host", "127.0.0.1"]
        + ["--port", str(port), "--mode", "legacy", "--address", cluster.address],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        yield port
    finally:
        server.kill()
        server.wait()


def test_ray_client_launches_from_a_process_outside_the_cluster(
    cluster: Any, client_server: int, tmp_path: Path
) -> None:
    # cluster="ray://HOST:PORT": Ray Client has no streaming tasks, so each rank is an actor
    # that the notebook asks for its output; the rest is the same launch.
    import subprocess
    import sys

    port = client_server
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print('rank', dist.get_rank(), 'of', dist.get_world_size())\n"
        "if sys.argv[1:] == ['--fail'] and dist.get_rank() == 1:\n"
        "    raise ValueError('bad value on rank 1')\n"
        "if sys.argv[1:] == ['--hang']:\n"
        "    import torch\n"
        "    if dist.get_rank() == 0:\n"
        "        dist.all_reduce(torch.ones(2))\n"
        "    dist.barrier()\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "notebook_accel.faces.cli", "launch"]
    command += ["--cluster", f"ray://127.0.0.1:{port}", "--num_processes", "2", str(script)]
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} of 2" in done.stdout
    failed = subprocess.run(
        [*command, "--fail"], env=environ, capture_output=True, text=True, timeout=300
    )
    assert failed.returncode == 1
    assert "ValueError: bad value on rank 1" in failed.stdout + failed.stderr
    # A stall: each actor answers where its rank is (the report by itself, then the
    # timeout's note).
    hung = [*command[:-1], "--stall_time", "3", "--timeout", "25", str(script), "--hang"]
    stalled = subprocess.run(hung, env=environ, capture_output=True, text=True, timeout=300)
    assert stalled.returncode == 1
    both = stalled.stdout + stalled.stderr
    assert "no rank has made progress" in both and "its timeout ran out" in both, both
    diagnosis = (
        "rank 0 in all_reduce at train.py, line 10; rank 1 in barrier at line 11: "
        "the ranks wait in different collectives."
    )
    assert both.count(diagnosis) == 2, both
    assert "rank 1 (pid" in both and "waiting in barrier at train.py, line 11" in both, both
    assert "runpy" not in both and "loading its function" not in both, both
    assert _all_free()


def _rank_times(factor: int) -> int:
    import os

    return int(os.environ["RANK"]) * factor


def test_panel_offers_the_joined_cluster_and_launches_there(cluster: Any) -> None:
    from notebook_accel.faces.panel import LaunchPanel

    panel = LaunchPanel(_rank_times, args=(7,))
    labels = dict(panel.hardware.options)
    ray_label = next(label for label, value in labels.items() if value == "ray")
    assert ray_label.startswith("Ray cluster: 2 nodes, 4 CPU")
    panel.hardware.value = "ray"
    panel.processes.value = 3
    panel.launch_button.click()
    assert panel.wait(timeout=240)
    assert panel.error is None, panel.error
    assert panel.results == [0, 7, 14]
    assert _all_free()


def test_without_internal_kv_s_namespace_keys_live_on_a_board_that_ends_with_them(
    cluster: Any,
) -> None:
    # Another Ray's shape: internal_kv's calls without ``namespace``. The keys a launch's
    # ranks exchange go to a named actor of the namespace, which ends with its last key.
    from ray.experimental import internal_kv

    from notebook_accel.private import ray as private_ray

    def older(key: str, value: Any = None) -> Any:
        raise AssertionError("the namespaced call is not there")

    namespace = "notebook_accel_test_board"
    with pytest.MonkeyPatch.context() as patch:
        for name in ("_internal_kv_get", "_internal_kv_put", "_internal_kv_del"):
            patch.setattr(internal_kv, name, older)
        assert private_ray.kv_get("rank0", namespace) is None
        private_ray.kv_put("rank0", "127.0.0.1:1234", namespace)
        private_ray.kv_put("rank1", "127.0.0.1:1235", namespace)
        board = ray.get_actor("notebook_accel_keys", namespace=namespace)
        assert private_ray.kv_get("rank0", namespace) == b"127.0.0.1:1234"
        private_ray.kv_del("rank0", namespace)
        assert private_ray.kv_get("rank1", namespace) == b"127.0.0.1:1235"
        private_ray.kv_del("rank1", namespace)
        # the last key gone: the actor has exited, nothing stays on the cluster
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(board.get.remote("rank1"), timeout=60)
        assert private_ray.kv_get("rank1", namespace) is None


_STALL = 3.0


def test_a_stall_says_where_each_rank_is_and_the_stop_keeps_it(cluster: Any) -> None:
    display = Recorder(output="main")
    config = _config(num_processes=2, output="main", stall_time=_STALL)
    with pytest.raises(KeyboardInterrupt) as stopped:
        launch(mismatched, (), None, config, display=display, stop=display.stop)
    # The report came by itself (the Recorder presses stop at it), once, in time.
    assert len(display.reports) == 1, display.reports
    assert display.waited is not None and display.waited <= _STALL + 5, display.waited
    zero, one = line_of(mismatched, "<- rank 0"), line_of(mismatched, "<- rank 1")
    this = "stalls.py"
    diagnosis = (
        f"rank 0 in all_reduce at {this}, line {zero}; rank 1 in broadcast at line {one}: "
        "the ranks wait in different collectives."
    )
    text = display.reports[0]
    assert text.startswith("[notebook_accel] no rank has made progress for"), text
    assert diagnosis in text, text
    # Each rank answered from its Ray worker: its pid, its node, its tensors, its stack.
    for rank, collective in ((0, "all_reduce"), (1, "broadcast")):
        assert re.search(
            rf"rank {rank} \(pid \d+, on 127\.0\.0\.1.*\): waiting in {collective} "
            rf"\(float32\[4\]\) at {this}",
            text,
        ), text
    assert text.count(", in mismatched") == 2 and "notebook_accel/launch" not in text, text
    note = note_of(stopped.value)
    assert note.startswith("[notebook_accel] stopped; where each rank was:"), note
    assert diagnosis in note
    assert _all_free()


def test_a_timeout_on_the_cluster_carries_where_each_rank_was(cluster: Any) -> None:
    times_out_with_a_note(_config(num_processes=2, timeout=15, stall_time=None))
    assert _all_free()


def _until_node_dies(marker: str) -> str:
    import os
    import time
    from pathlib import Path

    import ray as ray_in_rank

    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    node = ray_in_rank.get_runtime_context().get_node_id()
    Path(marker, f"{attempt}-{os.environ['RANK']}").write_text(node)
    if attempt == "0":
        time.sleep(600)
    return f"attempt {attempt}"


def test_a_dead_node_is_reported_and_the_restart_runs_elsewhere(
    cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worker_node = cluster.list_all_nodes()[1]

    def kill_worker_node() -> None:
        while len(list(tmp_path.glob("0-*"))) < 2:
            time.sleep(0.1)
        cluster.remove_node(worker_node, allow_graceful=False)

    threading.Thread(target=kill_worker_node, daemon=True).start()
    results = notebook_launcher(
        _until_node_dies,
        args=(str(tmp_path),),
        num_processes=2,
        cluster="ray",
        placement_strategy="SPREAD",
        max_restarts=1,
    )
    assert results == ["attempt 1", "attempt 1"]
    out = capsys.readouterr().out
    assert "WorkerDiedError" in out and "restart 1 of 1" in out
    nodes = {p.read_text() for p in tmp_path.glob("0-*")}
    assert worker_node.node_id in nodes  # attempt 0 had a rank on the node that died
    assert _all_free()


def test_bad_cluster_arguments_fail_before_anything_starts(cluster: Any) -> None:
    # More than the cluster has: a GPU on a CPU-only cluster, more CPUs than it holds.
    with pytest.raises(ConfigError, match="num_processes"):
        notebook_launcher(_chatty, args=(None,), cluster="ray", resources_per_worker={"GPU": 1})
    with pytest.raises(ConfigError, match="num_processes"):
        notebook_launcher(_chatty, args=(None,), num_processes=64, cluster="ray")
    with pytest.raises(ConfigError, match="cluster"):
        notebook_launcher(_chatty, args=(None,), cluster="slurm")
    with pytest.raises(ConfigError, match="resources_per_worker"):
        notebook_launcher(_chatty, args=(None,), resources_per_worker={"CPU": 1})
    with pytest.raises(ConfigError, match="placement_strategy"):
        notebook_launcher(_chatty, args=(None,), cluster="ray", placement_strategy="STRICT")
