"""LaunchPanel driven from code: real launches, a real Stop, the real config file."""

from __future__ import annotations

import json
import time
from typing import Any

import psutil

from notebook_accel import env
from notebook_accel.faces.panel import LaunchPanel
from notebook_accel.hardware import Machine
from tests.launch.helpers import worker_processes

CPU2 = Machine(cpu_cores=2)


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            pass
    return alive


def square(x: int) -> int:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print(f"rank {dist.get_rank()} squares {x}")
    return x * x


def sleeper() -> None:
    import time

    time.sleep(120)


def fails_on_rank_one() -> None:
    import os

    if os.environ["RANK"] == "1":
        raise ValueError("bad batch on rank 1")
    import time

    time.sleep(30)


def test_controls_offer_only_what_the_machine_has() -> None:
    panel = LaunchPanel(square, args=(3,), machine=CPU2)
    assert panel.hardware.options == (("CPU, 2 cores", "cpu"),)
    assert panel.processes.max == 2 and panel.processes.value == 2
    assert "no" in panel.precision.options and "bf16" in panel.precision.options

    gpus = Machine(cpu_cores=8, cuda_names=("NVIDIA H100",) * 8, cuda_bf16=True)
    panel = LaunchPanel(square, machine=gpus)
    assert panel.hardware.options[0] == ("CUDA, 8 × H100", "cuda")
    assert panel.processes.max == 8 and panel.processes.value == 8
    panel.hardware.value = "cpu"
    assert panel.processes.max == 8 and panel.processes.value == 2


def test_the_compile_dropdown_sets_the_launchs_dynamo_backend() -> None:
    panel = LaunchPanel(square, machine=CPU2)
    assert panel.compile.value == "no" and panel.launch_config.dynamo_backend == "no"
    assert "inductor" in dict(panel.compile.options).values()
    panel.compile.value = "inductor"
    assert panel.launch_config.dynamo_backend == "inductor"
    assert panel.launch_config.file_values()["dynamo_backend"] == "inductor"
    env.config_file().write_text(json.dumps({"dynamo_backend": "aot_eager"}))
    assert LaunchPanel(square, machine=CPU2).compile.value == "aot_eager"  # the saved choice


def test_launch_shows_results_ranks_and_saves_choices() -> None:
    panel = LaunchPanel(square, args=(7,), machine=CPU2)
    panel.seed.value = "3"
    panel.accumulation.value = 2
    panel.save_default.value = True
    panel.launch_button.click()
    assert panel.wait(timeout=60)
    assert panel.results == [49, 49] and panel.error is None
    assert "[49, 49]" in panel.outcome.value
    assert all("finished" in row.value for row in panel.ranks.children)
    assert "[rank 1] rank 1 squares 7" in panel.output_area.value
    saved = json.loads(env.config_file().read_text())
    assert saved["num_processes"] == 2 and saved["seed"] == 3
    assert saved["gradient_accumulation_steps"] == 2
    # The next panel starts from the saved choices.
    assert LaunchPanel(square, machine=CPU2).seed.value == "3"


def test_a_launch_saves_nothing_unless_asked() -> None:
    panel = LaunchPanel(square, args=(3,), machine=CPU2)
    panel.seed.value = "4"
    panel.launch_button.click()
    assert panel.wait(timeout=60) and panel.results == [9, 9]
    assert not env.config_file().exists()  # trying a seed does not change later launches
    assert LaunchPanel(square, machine=CPU2).seed.value == ""


def test_stop_ends_every_worker_and_the_next_launch_works() -> None:
    panel = LaunchPanel(sleeper, machine=CPU2)
    panel.launch_button.click()
    # Wait for both workers to exist (the bound only ends a failing test).
    deadline = time.monotonic() + 120
    while len(_alive(worker_processes())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "running" in panel.ranks.children[0].value
    assert len(_alive(worker_processes())) == 2
    panel.stop_button.click()
    assert panel.wait(timeout=60)  # stopped, not the workers' 120 s sleep
    assert isinstance(panel.error, KeyboardInterrupt)
    assert "Stopped" in panel.status.value
    assert all("stopped" in row.value for row in panel.ranks.children)
    assert _alive(worker_processes()) == []  # nothing left running
    panel.function, panel.args = square, (2,)
    panel.launch_button.click()
    assert panel.wait(timeout=60) and panel.results == [4, 4]


def test_a_worker_error_is_shown_plainly() -> None:
    panel = LaunchPanel(fails_on_rank_one, machine=CPU2)
    panel.launch_button.click()
    assert panel.wait(timeout=60)
    assert isinstance(panel.error, ValueError)
    assert "ValueError" in panel.outcome.value and "bad batch on rank 1" in panel.outcome.value
    assert "failed" in panel.ranks.children[1].value
    assert "stopped" in panel.ranks.children[0].value
    assert panel.stop_button.disabled and not panel.launch_button.disabled  # idle again


def test_corrupt_config_file_gives_a_message_and_defaults() -> None:
    env.config_file().write_text("{not json")
    panel = LaunchPanel(square, machine=CPU2)
    assert "not valid" in panel.status.value
    assert panel.processes.value == 2 and panel.seed.value == ""


def test_bad_seed_is_reported_without_launching() -> None:
    panel = LaunchPanel(square, machine=CPU2)
    panel.seed.value = "soon"
    panel.launch_button.click()
    assert not panel.running and panel.results is None
    assert "seed" in panel.status.value and "soon" in panel.status.value


def test_fp8_is_offered_only_on_gpus_that_have_it() -> None:
    def offered(capability: tuple[int, int] | None) -> tuple[str, ...]:
        machine = Machine(cpu_cores=8, cuda_names=("NVIDIA GPU",) * 2, cuda_capability=capability)
        return tuple(LaunchPanel(square, machine=machine).precision.options)

    assert "fp8" in offered((9, 0)) and "fp8" in offered((8, 9))
    assert "fp8" not in offered((8, 0)) and "fp8" not in offered(None)  # None: unknown
    assert "fp8" not in LaunchPanel(square, machine=CPU2).precision.options


# ---- [metrics] live chart, per-rank health, bars that did not finish ------------------------
def log_with_a_bar() -> None:
    import time

    from notebook_accel import Accelerator, tqdm

    accelerator = Accelerator()
    for i in tqdm(range(15), desc="train"):
        accelerator.backward(__import__("torch").ones(1, requires_grad=True).sum())
        accelerator.log({"loss": 1.0 / (i + 1)}, step=i)
        time.sleep(0.15)
    accelerator.wait_for_everyone()


def test_panel_draws_the_chart_keeps_the_rows_and_shows_health() -> None:
    panel = LaunchPanel(log_with_a_bar, machine=CPU2)
    panel.launch_button.click()
    assert panel.wait(timeout=90) and panel.error is None, panel.error
    assert panel.metrics == [{"step": i, "loss": 1.0 / (i + 1)} for i in range(15)]
    assert bytes(panel.chart.value).startswith(b"\x89PNG") and panel.chart.layout.display == ""
    assert "loss 0.06667 (best 0.06667)" in panel.chart_line.value
    rows = [row.value for row in panel.ranks.children]
    assert all("MiB RSS" in row and "steps/s" in row for row in rows), rows
    assert panel.bars.children[0].children[0].bar_style == "success"


def bar_then_sleep() -> None:
    import time

    from notebook_accel import tqdm

    for _ in tqdm(range(100), desc="slow"):
        time.sleep(0.1)


def _wait_for(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_stopped_bar_is_marked_stopped() -> None:
    panel = LaunchPanel(bar_then_sleep, machine=CPU2)
    panel.launch_button.click()
    assert _wait_for(lambda: len(panel.bars.children) == 1, 30)
    time.sleep(0.5)
    panel.stop_button.click()
    assert panel.wait(timeout=15)
    progress, text = panel.bars.children[0].children
    assert progress.bar_style == "warning" and "(stopped)" in text.value


def rank_one_freezes() -> None:
    import os
    import signal
    import time

    time.sleep(1.5)  # long enough for a health report or two
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGSTOP)  # stops reporting, without exiting
    time.sleep(60)


def test_a_rank_that_stops_reporting_is_flagged() -> None:
    panel = LaunchPanel(rank_one_freezes, machine=CPU2)
    panel.launch_button.click()
    rows = panel.ranks.children
    assert _wait_for(lambda: "not reporting" in rows[1].value, 30), rows[1].value
    assert "not reporting" not in rows[0].value
    panel.stop_button.click()
    assert panel.wait(timeout=15)
    assert "not reporting" not in rows[1].value  # the launch ended: no more flags


def test_a_panel_over_a_session_runs_on_its_workers_and_stop_keeps_them() -> None:
    from notebook_accel import Workers

    def count_runs() -> int:  # a nested function travels by value, as a cell's does
        global runs
        runs = globals().get("runs", 0) + 1  # the workers' namespace: kept between runs
        return runs

    with Workers(num_processes=2, hardware="cpu") as workers:
        panel = LaunchPanel(count_runs, machine=CPU2, workers=workers)
        assert panel.launch_button.description == "Run"
        assert panel.processes.value == 2 and panel.processes.disabled  # the session's choice
        for expected in (1, 2):
            panel.launch_button.click()
            assert panel.wait(timeout=60) and panel.results == [expected, expected], panel.error
        panel.function = bar_then_sleep
        panel.launch_button.click()
        assert _wait_for(lambda: len(panel.bars.children) == 1, 30)
        panel.stop_button.click()
        assert panel.wait(timeout=30)
        assert isinstance(panel.error, KeyboardInterrupt)
        assert "session is still usable" in panel.status.value
        assert not workers.closed and workers.pull("runs") == [2, 2]
