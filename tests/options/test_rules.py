"""options/rules.py: each rule of combination written once, the same for every face."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from notebook_accel import DeepSpeedPlugin, ParallelismConfig
from notebook_accel.config import LaunchConfig
from notebook_accel.errors import ConfigError
from notebook_accel.launch.plan import plan_for


def _refusal(make: Callable[[], object]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        make()
    return caught.value


def _words(refusal: ConfigError) -> tuple[str, str]:
    """What is accepted (in the launcher's names) and the hint after it."""
    hint = str(refusal).split(f"expected {refusal.accepted}.", 1)[1].strip()
    return refusal.accepted.replace("deepspeed_plugin", "deepspeed"), hint


def test_the_launcher_and_the_accelerator_refuse_with_the_same_words() -> None:
    from notebook_accel.training.accelerator import Accelerator

    pairs = [
        (  # DeepSpeed and FSDP
            lambda: LaunchConfig(deepspeed=2, fsdp="full"),
            lambda: Accelerator(deepspeed_plugin=DeepSpeedPlugin(), fsdp="full"),
        ),
        (  # FSDP in one process
            lambda: plan_for(LaunchConfig(hardware="cpu", num_processes=1, fsdp="full")),
            lambda: Accelerator(fsdp="full"),  # this test process is a single process
        ),
        (  # a mesh whose sizes are not the job's
            lambda: plan_for(
                LaunchConfig(hardware="cpu", num_processes=1, parallelism_config={"tp_size": 3})
            ),
            lambda: Accelerator(parallelism_config=ParallelismConfig(tp_size=3)),
        ),
        (  # torch.compile with a sharded model
            lambda: LaunchConfig(dynamo_backend="inductor", fsdp="full"),
            lambda: Accelerator(dynamo_backend="inductor", fsdp="full"),
        ),
    ]
    for launch, accelerator in pairs:
        assert _words(_refusal(launch)) == _words(_refusal(accelerator))
    mesh = _refusal(lambda: Accelerator(parallelism_config=ParallelismConfig(), fsdp="full"))
    assert mesh.parameter == "parallelism_config"
    assert mesh.accepted == "None when fsdp or deepspeed_plugin is set"  # the Accelerator's words


def test_the_rules_import_no_torch() -> None:
    code = "import sys, notebook_accel.options.rules; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
