"""LaunchConfig validation and the config file shared by the launcher, panel and CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from notebook_accel import ConfigError, debug_launcher, notebook_launcher
from notebook_accel.config import LaunchConfig, load_file, save_file


def _config_path() -> Path:
    return Path(os.environ["NOTEBOOK_ACCEL_CONFIG_FILE"])


def test_round_trip_and_atomic_write() -> None:
    config = LaunchConfig(num_processes=3, mixed_precision="bf16", seed=7)
    path = save_file(config)
    assert path == _config_path()
    assert load_file() == config.file_values()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


@pytest.mark.parametrize(
    "text", ["{not json", "[1, 2]", '{"num_processes": -4}', '{"mixed_precision": "fp32"}']
)
def test_a_broken_file_warns_and_gives_defaults(text: str) -> None:
    _config_path().write_text(text)
    with pytest.warns(UserWarning, match="is not valid"):
        assert load_file() == {}
    with pytest.warns(UserWarning):
        assert LaunchConfig.from_defaults() == LaunchConfig()


def test_unknown_keys_are_ignored() -> None:
    _config_path().write_text(json.dumps({"num_processes": 3, "colour": "blue"}))
    assert load_file() == {"num_processes": 3}


def test_launcher_takes_its_defaults_from_the_file_and_arguments_win() -> None:
    save_file(LaunchConfig(num_processes=3, hardware="cpu"))
    assert notebook_launcher(lambda: 1) == [1, 1, 1]
    assert notebook_launcher(lambda: 1, num_processes=1) == [1]
    assert debug_launcher(lambda: 1) == [1, 1]  # debug_launcher ignores the file


def test_validation_messages() -> None:
    with pytest.raises(ConfigError, match=r"master_port=70000 .*\[1, 65535\]"):
        LaunchConfig(master_port=70000)
    with pytest.raises(ConfigError, match="master_port=None .*fixed TCP port when num_nodes"):
        LaunchConfig(num_nodes=2)
    with pytest.raises(ConfigError, match="seed=-1"):
        LaunchConfig(seed=-1)
