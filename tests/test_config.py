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


def _seed_and_fsdp() -> tuple[str | None, str | None]:
    from notebook_accel import env

    return env.launch_option("seed"), env.launch_option("fsdp")


def test_the_banner_names_what_came_from_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    save_file(LaunchConfig(num_processes=2, hardware="cpu", seed=5))
    notebook_launcher(lambda: 1)
    out = capsys.readouterr().out
    assert "Launching 2 processes on CPU (gloo)\n" in out
    note = next(line for line in out.splitlines() if line.startswith("From the config file"))
    assert str(_config_path()) in note
    assert "num_processes=2" in note and "seed=5" in note and "hardware='cpu'" in note
    assert "mixed_precision" not in note  # the file's "no" is the built-in default anyway
    notebook_launcher(lambda: 1, num_processes=2, hardware="cpu", seed=1)
    assert "From the config file" not in capsys.readouterr().out  # the call decided all


def test_seed_false_and_fsdp_false_clear_saved_choices() -> None:
    save_file(LaunchConfig(num_processes=2, hardware="cpu", seed=5, fsdp="full"))
    config = LaunchConfig.from_defaults()
    assert config.seed == 5 and config.fsdp is not None
    assert notebook_launcher(_seed_and_fsdp, seed=False, fsdp=False) == [(None, None)] * 2
    cleared = LaunchConfig.from_defaults(seed=False, fsdp="no")
    assert (
        cleared.seed is None
        and cleared.fsdp is None
        and cleared.from_file
        == (
            "hardware",
            "num_processes",
        )
    )
    assert notebook_launcher(_seed_and_fsdp, fsdp=False) == [("5", None)] * 2


def test_reset_file_gives_the_built_in_defaults_back() -> None:
    from notebook_accel.config import reset_file

    save_file(LaunchConfig(num_processes=3, seed=5))
    assert reset_file() == _config_path() and not _config_path().exists()
    assert LaunchConfig.from_defaults() == LaunchConfig()
    reset_file()  # no file: nothing to do
