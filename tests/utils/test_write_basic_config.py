"""accelerate's ``write_basic_config`` writes our config file, and launches read what it wrote:
at the default location every launch, at another ``notebook-accel launch --config_file``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from notebook_accel import ConfigError, notebook_launcher
from notebook_accel.utils import write_basic_config


def _precision() -> tuple[str, str | None]:
    import os

    from notebook_accel import Accelerator

    return Accelerator(cpu=True).mixed_precision, os.environ.get("NOTEBOOK_ACCEL_MIXED_PRECISION")


def test_the_default_location_is_what_every_launch_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    default = Path(os.environ["NOTEBOOK_ACCEL_CONFIG_FILE"])  # conftest: this test's own
    assert write_basic_config(mixed_precision="BF16") == default
    assert json.loads(default.read_text())["mixed_precision"] == "bf16"
    assert notebook_launcher(_precision, num_processes=2) == [("bf16", "bf16")] * 2
    # an argument given to the launch still wins over the file
    assert notebook_launcher(_precision, num_processes=2, mixed_precision="no")[0][0] == "no"
    # as accelerate's, an existing file is left alone
    assert write_basic_config(mixed_precision="no") is False
    assert "already exists" in capsys.readouterr().out
    assert json.loads(default.read_text())["mixed_precision"] == "bf16"


def test_a_wrong_precision_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mixed_precision='fp32'"):
        write_basic_config(mixed_precision="fp32", save_location=tmp_path / "c.json")
    assert not (tmp_path / "c.json").exists()


SCRIPT = textwrap.dedent(
    """
    from notebook_accel import Accelerator

    acc = Accelerator(cpu=True)
    print(f"rank={acc.process_index} world={acc.num_processes} mp={acc.mixed_precision}")
    """
)


def test_another_location_is_read_by_launch_config_file(tmp_path: Path) -> None:
    saved = tmp_path / "elsewhere" / "basic.json"
    assert write_basic_config(mixed_precision="bf16", save_location=str(saved)) == saved
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, NOTEBOOK_ACCEL_CONFIG_FILE=str(tmp_path / "default.json"))
    done = subprocess.run(
        [sys.executable, "-m", "notebook_accel.faces.cli", "launch", "--config_file", str(saved)]
        + ["--num_processes", "2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] rank={rank} world=2 mp=bf16" in done.stdout
    assert not (tmp_path / "default.json").exists()  # the default location stayed untouched
