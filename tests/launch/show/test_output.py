"""Output relay: whole, rank-prefixed lines from Python and from C, in each rank's order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from notebook_accel import debug_launcher


def _chatty(lines: int) -> None:
    import ctypes

    rank = int(os.environ["RANK"])
    for i in range(lines):
        # Long lines written in several pieces: a relay that splits mid-line would show it.
        print(f"r{rank} line {i:04d} ", end="")
        print("x" * 300, end="")
        print(" end")
    os.write(1, f"r{rank} fd-level write\n".encode())
    libc = ctypes.CDLL(None)
    libc.printf(f"r{rank} printf from C\n".encode())
    print(f"r{rank} to stderr", file=sys.stderr)
    print(f"r{rank} no newline at the end", end="")


def test_lines_are_whole_prefixed_and_in_order(capfd: pytest.CaptureFixture[str]) -> None:
    debug_launcher(_chatty, args=(200,), num_processes=2)
    out, err = capfd.readouterr()
    body = [line for line in out.splitlines() if not line.startswith("Launching")]
    pattern = re.compile(r"^\[rank (\d)\] r\1 line (\d{4}) x{300} end$")
    for rank in (0, 1):
        mine = [line for line in body if line.startswith(f"[rank {rank}] ")]
        numbered = [pattern.match(line) for line in mine[:200]]
        assert all(numbered), [line for line, m in zip(mine, numbered, strict=True) if not m][:3]
        assert [int(m.group(2)) for m in numbered if m] == list(range(200))
        assert mine[200:] == [
            f"[rank {rank}] r{rank} fd-level write",
            f"[rank {rank}] r{rank} printf from C",
            f"[rank {rank}] r{rank} no newline at the end",
        ]
        assert f"[rank {rank}] r{rank} to stderr" in err.splitlines()
    assert out.splitlines()[0] == "Launching 2 processes on CPU (gloo)"


def test_output_main_shows_only_rank_zero(capfd: pytest.CaptureFixture[str]) -> None:
    debug_launcher(_chatty, args=(3,), num_processes=2, output="main")
    out, err = capfd.readouterr()
    assert "[rank 0] r0 fd-level write" in out
    assert "[rank 1]" not in out + err


def test_progress_text_keeps_the_last_state(capfd: pytest.CaptureFixture[str]) -> None:
    def redraw() -> None:
        for i in range(5):
            print(f"\rstep {i}/4", end="", flush=True)
        print()

    debug_launcher(redraw, num_processes=1)
    out, _ = capfd.readouterr()
    assert "[rank 0] step 4/4" in out.splitlines()


def test_relay_in_a_plain_terminal_script(tmp_path: object) -> None:
    script = textwrap.dedent("""
        from notebook_accel import notebook_launcher
        def f():
            print("hello")
            return 1
        if __name__ == "__main__":
            print(notebook_launcher(f, num_processes=2, hardware="cpu"))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=os.getcwd()
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(lines[1:3]) == ["[rank 0] hello", "[rank 1] hello"]
    assert lines[-1] == "[1, 1]"


def test_a_script_without_main_guard_is_not_re_run(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "train.py"
    path.write_text(
        textwrap.dedent("""
        from notebook_accel import notebook_launcher
        print("top level ran")
        def f():
            return 2
        print(notebook_launcher(f, num_processes=2, hardware="cpu"))
    """)
    )
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, cwd=os.getcwd()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("top level ran") == 1
    assert done.stdout.splitlines()[-1] == "[2, 2]"


def test_output_none_writes_nothing_to_the_cell(capfd: pytest.CaptureFixture[str]) -> None:
    # Not even the banner: "none" is for launches driven by code that prints its own summary.
    assert debug_launcher(_chatty, args=(3,), num_processes=2, output="none") == [None, None]
    out, err = capfd.readouterr()
    assert out == "" and err == ""
