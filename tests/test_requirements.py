"""Our requirements never replace what Colab's and Kaggle's images pin (.ci/pins/*.txt).

The static check runs everywhere: each pinned version satisfies our requirement on it. The
install check runs where the environment holds Colab's pins (the matrix's colab job,
.ci/jobs/colab): pip resolves an install of this checkout there and changes none of them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / ".ci" / "pins"


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(image: str) -> dict[str, str]:
    """The ``name==version`` lines of ``.ci/pins/<image>.txt`` (not the files it includes)."""
    pins = {}
    for line in (PINS / f"{image}.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[_name(name)] = version.strip()
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"]]


@pytest.mark.parametrize("image", ["colab", "kaggle", "oldest", "xla28"])
def test_every_pinned_version_satisfies_our_requirements(image: str) -> None:
    pins = _pins(image)
    checked = 0
    for requirement in _requirements():
        version = pins.get(_name(requirement.name))
        if version is not None:
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{requirement} refuses {image}'s {requirement.name}=={version}"
            )
            checked += 1
    assert checked, f"none of our requirements is pinned by {image}"


def test_colab_s_widgets_and_kernel_and_the_oldest_torch_are_accepted() -> None:
    # the floors the issue names: ipywidgets 7.7 and 8 both, torch from 2.8
    accepted = {_name(r.name): r.specifier for r in _requirements()}
    for name, version in [("ipywidgets", "7.7.1"), ("ipywidgets", "8.1.9"), ("torch", "2.8.0")]:
        assert accepted[name].contains(version), (name, version, accepted[name])
    assert accepted["ipykernel"].contains("6.17.1")


def _holds(pins: dict[str, str]) -> bool:
    for name, version in pins.items():
        try:
            if metadata.version(name) != version:
                return False
        except metadata.PackageNotFoundError:
            return False
    return True


def test_installing_into_colab_s_pins_changes_none_of_them() -> None:
    pins = _pins("colab")
    if not _holds(pins):
        pytest.skip("this environment does not hold Colab's pins (the matrix's colab job does)")
    # What `pip install <this checkout>` would do here: offline (every requirement must be
    # met by what is installed, or pip fails naming it), no build environment to fetch.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
         "--no-index", "--no-build-isolation", str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    installs = {
        _name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(done.stdout)["install"]
    }
    assert set(installs) == {"notebook-accel"}, installs  # nothing of Colab's replaced
    assert _holds(pins)
    assert metadata.version("ipywidgets") == "7.7.1"
