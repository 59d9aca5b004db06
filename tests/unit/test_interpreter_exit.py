"""Riverhouse's processes skip the interpreter's last full collection as they exit (runtime/interpreter_exit.py).

Each case is a new interpreter: an exit handler registered before the code under test runs after
its handlers (last registered, first run), and prints how many objects are frozen by then.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PROBE = textwrap.dedent(
    """
    import atexit, gc, sys
    atexit.register(lambda: print("frozen", gc.get_freeze_count(), flush=True))
    """
)


def frozen_at_exit(code: str, tmp_path: Path) -> int:
    env_code = PROBE + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", env_code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"RIVERHOUSE_PIPELINES": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("frozen ")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    return int(lines[-1].split()[1])


def test_a_plain_process_freezes_nothing(tmp_path: Path) -> None:
    assert frozen_at_exit("import riverhouse.platform.runtime.interpreter_exit", tmp_path) == 0


def test_registered_the_objects_alive_at_exit_are_frozen(tmp_path: Path) -> None:
    code = """
        from riverhouse.platform.runtime.interpreter_exit import skip_final_collection
        skip_final_collection()
        skip_final_collection()  # once is enough: a second call registers nothing more
        kept = [[i] for i in range(100_000)]
    """
    assert frozen_at_exit(code, tmp_path) > 100_000


def test_the_cli_registers_it(tmp_path: Path) -> None:
    code = """
        sys.argv = ["riverhouse", "--help"]
        from riverhouse.cli import main
        try:
            main()
        except SystemExit:
            pass
    """
    assert frozen_at_exit(code, tmp_path) > 0


def test_the_code_location_registers_it(tmp_path: Path) -> None:
    """A Dagster run worker runs no Riverhouse entry point: it loads riverhouse.definitions."""
    assert frozen_at_exit("import riverhouse.definitions", tmp_path) > 0
