"""LaunchConfig validation and the config file shared by the launcher, panel and CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from notebook_accel import ConfigError, debug_launcher, notebook_launcher
from notebook_accel.config import Cli, LaunchConfig, load_file, option, save_file


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


def _seed_and_fsdp() -> tuple[int | None, object]:
    from notebook_accel import launched

    return launched.option("seed"), launched.option("fsdp")


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
    assert notebook_launcher(_seed_and_fsdp, fsdp=False) == [(5, None)] * 2


def test_reset_file_gives_the_built_in_defaults_back() -> None:
    from notebook_accel.config import reset_file

    save_file(LaunchConfig(num_processes=3, seed=5))
    assert reset_file() == _config_path() and not _config_path().exists()
    assert LaunchConfig.from_defaults() == LaunchConfig()
    reset_file()  # no file: nothing to do


# -- adding an option: one field of the table, every face follows ----------------------------
def _positive_seconds(name: str, value: object) -> object:
    if value is not None and (not isinstance(value, int | float) or value <= 0):
        raise ConfigError(name, value, "seconds > 0, or None")
    return value


@dataclasses.dataclass(frozen=True)
class WithPatience(LaunchConfig):
    """A copy of the table with one more option, declared as the real ones are."""

    patience: float | None = option(
        None,
        check=_positive_seconds,
        doc="seconds to wait.",
        cli=Cli("patience", "SECONDS", float),
        panel="Patience (s)",
        session="yes",
        worker=True,
        variables=("MY_PATIENCE",),
    )


def _patience() -> tuple[object, str | None]:
    from notebook_accel import launched

    return launched.option("patience"), os.environ.get("MY_PATIENCE")


def test_an_option_added_to_the_table_reaches_every_face(tmp_path: Path) -> None:
    from notebook_accel.config import given, options
    from notebook_accel.faces.cli import build_parser, config_from
    from notebook_accel.faces.panel import LaunchPanel
    from notebook_accel.hardware import Machine
    from notebook_accel.launch import launch

    # checked as a field, before any process starts
    with pytest.raises(ConfigError, match="patience=-1 .*seconds > 0"):
        WithPatience(patience=-1)
    # the call's arguments: Workers and notebook_launcher take the table's names
    assert given({"patience": 3, "function": None}, table=WithPatience) == {"patience": 3}
    assert given({"patience": 3}, session=True, table=WithPatience) == {"patience": 3}
    assert "patience" not in options()  # the real table is untouched
    # the config file: written, read back, and named in the banner's note
    save_file(WithPatience(patience=4.0))
    assert load_file(table=WithPatience)["patience"] == 4.0
    assert load_file() == LaunchConfig().file_values()  # not a key of the real table
    from_file = WithPatience.from_defaults()
    assert from_file.patience == 4.0 and from_file.from_file == ("patience",)
    # the command line
    args = build_parser(WithPatience).parse_args(["launch", "--patience", "7", "x.py"])
    assert config_from(args, WithPatience).patience == 7.0
    # the panel: a plain control of its own
    panel = LaunchPanel(lambda: 1, machine=Machine(cpu_cores=2), table=WithPatience)
    assert panel._controls["Patience (s)"].widget.value == "4.0"  # the saved value
    panel._controls["Patience (s)"].widget.value = "9"
    assert panel.launch_config.patience == 9
    # the workers: the option in their launch, and its variable for user code
    config = WithPatience(num_processes=2, hardware="cpu", patience=2.5)
    assert launch(_patience, (), None, config) == [(2.5, "2.5")] * 2


def test_the_launchers_parameters_are_the_tables_options() -> None:
    import inspect

    from notebook_accel import Workers
    from notebook_accel.config import options

    table = options()
    launcher = set(inspect.signature(notebook_launcher).parameters)
    launched = {name for name, spec in table.items() if spec.session != "only"}
    assert launcher == {"function", "args", "kwargs", "use_port", *launched}
    session = set(inspect.signature(Workers).parameters)
    assert session == {name for name, spec in table.items() if spec.session != "no"}
    for name, spec in table.items():  # each documented once, from the table
        in_launcher = f"        {name}: " in (notebook_launcher.__doc__ or "")
        assert in_launcher is (spec.session != "only")
        in_session = f"        {name}: " in (Workers.__doc__ or "")
        assert in_session is (spec.session in ("yes", "only"))


# -- accelerate 1.16's notebook_launcher parameters: options of the table -------------------
def test_rendezvous_options_of_accelerate_116() -> None:
    from notebook_accel.errors import NotProvidedError

    config = LaunchConfig(rdzv_endpoint="10.1.2.3:1234", rdzv_conf={"timeout": 9})
    assert (config.master_addr, config.master_port, config.wait_for_machine_0()) == (
        "10.1.2.3",
        1234,
        9.0,
    )
    assert LaunchConfig(rdzv_endpoint="host-0").master_addr == "host-0"
    assert LaunchConfig(rdzv_endpoint="").rdzv_endpoint is None  # accelerate's default
    with pytest.raises(ConfigError, match="rdzv_endpoint"):
        LaunchConfig(rdzv_endpoint="10.1.2.3:1234", master_addr="10.9.9.9")
    with pytest.raises(ConfigError, match="rdzv_endpoint"):
        LaunchConfig(rdzv_endpoint="10.1.2.3:99999")
    # torch elastic's agent's options: accepted at their defaults, refused by name otherwise
    LaunchConfig(rdzv_backend="static", rdzv_id="none", monitor_interval=0.1)
    for given in ({"rdzv_backend": "c10d"}, {"monitor_interval": 5}, {"rdzv_conf": {"is_host": 1}}):
        with pytest.raises(NotProvidedError, match="torch elastic"):
            LaunchConfig(**given)


def _never_runs() -> None:
    raise AssertionError("machine 0 is unreachable: no rank runs")


def test_rdzv_endpoint_and_timeout_reach_the_launch() -> None:
    """Machine 1 of 2 waits rdzv_conf's timeout for machine 0 at rdzv_endpoint, then says so."""
    start = time.monotonic()
    with pytest.raises(Exception, match="192.0.2.1") as caught:
        notebook_launcher(
            _never_runs,
            num_processes=1,
            hardware="cpu",
            num_nodes=2,
            node_rank=1,
            rdzv_endpoint="192.0.2.1:29473",  # TEST-NET-1: never routed
            rdzv_conf={"timeout": 3},
        )
    assert "AssertionError" not in str(caught.value)
    assert time.monotonic() - start < 30  # not the launcher's default wait


def test_stall_time_left_out_takes_the_file_and_none_turns_the_report_off() -> None:
    from notebook_accel.config import DEFAULT
    from notebook_accel.faces.cli import build_parser, config_from
    from notebook_accel.faces.panel import LaunchPanel
    from notebook_accel.hardware import Machine

    assert LaunchConfig().stall_time == 60
    for wrong in (0, -1, "soon", True):
        with pytest.raises(ConfigError, match="stall_time=.*seconds > 0, or None"):
            LaunchConfig(stall_time=wrong)
    save_file(LaunchConfig(stall_time=5))
    # left out (the launchers' DEFAULT): the file's; None: off, over the file's
    assert LaunchConfig.from_defaults(stall_time=DEFAULT).stall_time == 5
    assert LaunchConfig.from_defaults(stall_time=None).stall_time is None
    assert LaunchConfig.from_defaults(stall_time=None).from_file == ()
    # the command line: --stall_time none, or a number; absent: the file's
    parse = build_parser().parse_args
    assert config_from(parse(["launch", "--stall_time", "none", "x.py"])).stall_time is None
    assert config_from(parse(["launch", "--stall-time", "7.5", "x.py"])).stall_time == 7.5
    assert config_from(parse(["launch", "x.py"])).stall_time == 5
    # the panel: a plain control; "null" turns it off, empty leaves it to the file
    panel = LaunchPanel(lambda: 1, machine=Machine(cpu_cores=2))
    control = panel._controls["Stall report (s)"].widget
    assert control.value == "5"
    control.value = "null"
    assert panel.launch_config.stall_time is None
    control.value = ""
    assert panel.launch_config.stall_time == 5
