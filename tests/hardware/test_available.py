"""accelerate.utils's ``is_*_available`` probes answer as accelerate 1.16's on this machine."""

from __future__ import annotations

import pytest

from notebook_accel.hardware import available


def _probes() -> list[str]:
    """Every probe notebook_accel provides (hardware/available.py's; refused ones are
    placeholder classes elsewhere and never here)."""
    return [name for name in available.__all__ if name.startswith("is_")]


@pytest.mark.parametrize("name", _probes())
def test_each_probe_answers_as_accelerates(name: str) -> None:
    accelerate_utils = pytest.importorskip("accelerate.utils")
    import notebook_accel.utils

    ours = getattr(notebook_accel.utils, name)
    assert ours is getattr(available, name)
    answer = ours()
    assert isinstance(answer, bool)  # accelerate's say None for some absent packages
    assert answer == bool(getattr(accelerate_utils, name)()), name


def test_rich_follows_accelerates_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rich")
    from notebook_accel.utils import is_rich_available

    monkeypatch.delenv("ACCELERATE_ENABLE_RICH", raising=False)
    assert is_rich_available() is False
    monkeypatch.setenv("ACCELERATE_ENABLE_RICH", "1")
    assert is_rich_available() is True


def test_bf16_and_xla_on_this_cpu_machine() -> None:
    from notebook_accel.utils import is_bf16_available, is_torch_xla_available

    assert is_bf16_available() is True  # the CPU runs bf16 autocast
    assert is_torch_xla_available(check_is_tpu=False) in (True, False)
    with pytest.raises(ValueError, match="cannot both"):
        is_torch_xla_available(check_is_tpu=True, check_is_gpu=True)
