"""``notebook-accel launch | config | env`` run as a user would: a real command, real workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TRAIN = textwrap.dedent(
    """
    import os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 1)
    for p in model.parameters():  # same start on every rank, as DDP would broadcast
        torch.nn.init.constant_(p, 0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(dist.get_rank())
    for step in range(3):
        x = torch.randn(8, 4)
        loss = ((model(x) - 1.0) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    print(f"world={dist.get_world_size()} sum={total.item():g} args={sys.argv[1:]} "
          f"mp={os.environ['NOTEBOOK_ACCEL_MIXED_PRECISION']}")
    if "--fail" in sys.argv and dist.get_rank() == 1:
        raise ValueError("the data on rank 1 is broken")
    """
)


def cli(
    *args: str, config: Path, stdin: str = "", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NOTEBOOK_ACCEL_CONFIG_FILE=str(config))
    return subprocess.run(
        [sys.executable, "-m", "notebook_accel.faces.cli", *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return tmp_path / "config.json"


def test_launch_runs_the_script_on_two_processes(script: Path, config: Path) -> None:
    done = cli("launch", "--num_processes", "2", str(script), "--epochs", "3", config=config)
    assert done.returncode == 0, done.stderr
    assert "Launching 2 processes on CPU (gloo)" in done.stdout
    for rank in (0, 1):
        assert f"[rank {rank}] world=2 sum=3 args=['--epochs', '3'] mp=no" in done.stdout


def test_a_failing_script_exits_1_with_the_worker_traceback(script: Path, config: Path) -> None:
    done = cli("launch", "--num_processes", "2", str(script), "--fail", config=config)
    assert done.returncode == 1
    assert "Traceback from rank 1" in done.stderr
    assert f'File "{script}"' in done.stderr
    assert "ValueError: the data on rank 1 is broken" in done.stderr


def test_sys_exit_code_of_the_script_is_the_exit_code(tmp_path: Path, config: Path) -> None:
    path = tmp_path / "exit3.py"
    path.write_text("import sys\nsys.exit(3)\n")
    done = cli("launch", "--num_processes", "2", str(path), config=config)
    assert done.returncode == 3
    assert "exited with 3" in done.stderr


def test_config_default_then_launch_uses_the_written_file(script: Path, config: Path) -> None:
    done = cli("config", "--default", config=config)
    assert done.returncode == 0, done.stderr
    saved = json.loads(config.read_text())
    assert saved["num_processes"] == 2 and saved["mixed_precision"] == "no"
    # Change one saved choice, as the panel would: launch without options must follow it.
    saved["mixed_precision"] = "bf16"
    config.write_text(json.dumps(saved))
    done = cli("launch", str(script), config=config)
    assert done.returncode == 0, done.stderr
    assert "[rank 1] world=2 sum=3 args=[] mp=bf16" in done.stdout


def test_dynamo_backend_reaches_the_scripts_accelerator(tmp_path: Path, config: Path) -> None:
    script = tmp_path / "compiled.py"
    script.write_text(
        "from notebook_accel import Accelerator\n"
        "print('backend', Accelerator().dynamo_plugin.backend.value)\n"
    )
    done = cli(
        "launch", "--num_processes", "1", "--dynamo_backend", "INDUCTOR", str(script), config=config
    )
    assert done.returncode == 0, done.stderr
    assert "backend INDUCTOR" in done.stdout


def test_config_reset_deletes_the_file(config: Path) -> None:
    config.write_text(json.dumps({"seed": 3}))
    done = cli("config", "--reset", config=config)
    assert done.returncode == 0, done.stderr
    assert f"Removed {config}" in done.stdout and not config.exists()


def test_config_questions_write_the_answers(script: Path, config: Path) -> None:
    # hardware, processes (one wrong answer first), precision, machines, DeepSpeed
    done = cli("config", config=config, stdin="cpu\n0\n3\nbf16\n1\nno\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not accepted" in done.stdout
    saved = json.loads(config.read_text())
    assert (saved["hardware"], saved["num_processes"], saved["mixed_precision"]) == (
        "cpu",
        3,
        "bf16",
    )
    done = cli("launch", str(script), config=config)
    assert done.returncode == 0, done.stderr
    assert "[rank 2] world=3 sum=6" in done.stdout


def test_env_prints_versions_and_hardware(config: Path) -> None:
    done = cli("env", config=config)
    assert done.returncode == 0, done.stderr
    assert "- torch: 2." in done.stdout
    assert "- CPU cores:" in done.stdout
    assert str(config) in done.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["launch", "--num_procs", "2", "x.py"], "--num_procs"),
        (["launch", "--num_processes", "0", "SCRIPT"], "--num_processes=0"),
        (["launch", "--mixed_precision", "fp32", "SCRIPT"], "--mixed_precision"),
        (
            [
                "launch",
                "--num_machines",
                "2",
                "--machine_rank",
                "2",
                "--main_process_port",
                "29400",
                "SCRIPT",
            ],
            "--machine_rank=2",
        ),
        (["launch", "--num_machines", "2", "SCRIPT"], "--main_process_port"),
        (["launch", "missing.py"], "script='missing.py'"),
        (["launch", "--timeout", "soon", "SCRIPT"], "--timeout"),
        (["launch", "--dynamo_backend", "fast", "SCRIPT"], "--dynamo_backend"),
    ],
)
def test_bad_input_names_the_option(
    args: list[str], named: str, script: Path, config: Path
) -> None:
    done = cli(*[str(script) if a == "SCRIPT" else a for a in args], config=config)
    assert done.returncode == 2
    assert named in done.stderr
    assert "Traceback" not in done.stderr


def test_unreachable_main_address_fails_within_the_rendezvous_timeout(
    script: Path, config: Path
) -> None:
    start = time.monotonic()
    done = cli(
        "launch",
        "--num_machines",
        "2",
        "--machine_rank",
        "1",
        "--num_processes",
        "1",
        "--main_process_ip",
        "192.0.2.1",  # TEST-NET-1: never routed
        "--main_process_port",
        "29471",
        "--rendezvous_timeout",
        "3",
        str(script),
        config=config,
        timeout=60,
    )
    assert done.returncode == 1
    assert "--main_process_ip" in done.stderr and "192.0.2.1" in done.stderr
    assert time.monotonic() - start < 30


HANGS = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
print("ready", flush=True)
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(1))
else:
    dist.broadcast(torch.ones(1), 0)
"""


def test_a_stalled_script_is_reported_and_ctrl_c_says_where(tmp_path: Path) -> None:
    import signal

    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    env = dict(os.environ, NOTEBOOK_ACCEL_CONFIG_FILE=str(tmp_path / "config.json"))
    command = [sys.executable, "-m", "notebook_accel.faces.cli", "launch", "--num_processes"]
    child = subprocess.Popen(
        [*command, "2", "--stall_time", "3", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        lines = []
        for line in child.stdout:  # until the report's diagnosis comes
            lines.append(line)
            if "the ranks wait in different collectives" in line:
                break
        assert (
            "rank 0 in all_reduce at hangs.py, line 5; rank 1 in broadcast at line 7" in (lines[-1])
        ), lines
        child.send_signal(signal.SIGINT)  # Ctrl-C in the terminal
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130
    assert "notebook-accel launch: interrupted\n[notebook_accel] stopped; where each" in err, err
    assert "rank 1 in broadcast at line 7" in err, err
