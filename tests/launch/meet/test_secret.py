"""launch/meet/secret.py: the job's secret: NOTEBOOK_ACCEL_SECRET, else a 0600 file made at
first use."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from notebook_accel import debug_launcher, env
from notebook_accel.errors import ConfigError
from notebook_accel.launch.meet.secret import job_secret

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config folder of the test's own, and no secret in the environment."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(env.SECRET_VARIABLE)
    return tmp_path / "config" / "notebook_accel" / "secret"


def test_the_file_is_made_on_first_use_private_and_kept(home: Path) -> None:
    first = job_secret()
    assert home.is_file() and len(first) == 64  # secrets.token_hex(32)
    assert stat.S_IMODE(home.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.parent.stat().st_mode) == 0o700
    assert job_secret() == first
    assert [p.name for p in home.parent.iterdir()] == ["secret"]  # no temporary left


def test_the_variable_wins_and_no_file_is_made(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.SECRET_VARIABLE, "shared by every machine")
    assert job_secret() == b"shared by every machine"
    assert not home.exists()
    monkeypatch.setenv(env.SECRET_VARIABLE, " ")
    with pytest.raises(ConfigError, match="NOTEBOOK_ACCEL_SECRET"):
        job_secret()


def test_a_file_others_can_read_is_refused(home: Path) -> None:
    job_secret()
    home.chmod(0o644)
    with pytest.raises(ConfigError, match=r"mode 0644.*chmod 600"):
        job_secret()


_RACER = """
import sys
from notebook_accel.launch.meet.secret import job_secret
sys.stdin.readline()  # all start together: the test writes one line to each
print(job_secret().decode())
"""


def test_machines_on_a_shared_home_that_create_it_at_once_agree(home: Path) -> None:
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    for racer in racers:  # every one is waiting on its stdin: go
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    answers = {racer.communicate(timeout=60)[0].strip() for racer in racers}
    assert answers == {home.read_text().strip()}
    assert [p.name for p in home.parent.iterdir()] == ["secret"]


def _environment_secret() -> str | None:
    return os.environ.get("NOTEBOOK_ACCEL_SECRET")


def test_the_secret_never_reaches_the_workers() -> None:
    assert os.environ.get(env.SECRET_VARIABLE)  # set for the session (conftest)
    assert debug_launcher(_environment_secret, num_processes=1) == [None]
