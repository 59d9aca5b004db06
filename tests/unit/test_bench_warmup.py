"""The page's sentence about riverhouse_dedup's unmeasured warm-up runs and the JIT's CPU in them."""

from __future__ import annotations

import pytest

from riverhouse_bench.report import _warmup_text

pytestmark = pytest.mark.unit


def test_the_warmup_runs_and_the_jit_cpu_are_named() -> None:
    dedup = {"warmup_runs_seconds": [6.1, 5.0], "jit_cpu_s": {"warmup": [4.94, 3.0], "steady": [1.2, 1.36]}}
    assert _warmup_text(dedup) == (
        ": 2 unmeasured warm-up runs took 6.10, 5.00 s, while the JIT compiler threads used 4.9, 3.0 CPU s "
        "(in the steady runs: 1.2, 1.4)"
    )


def test_without_warmup_runs_nothing_is_said() -> None:
    assert _warmup_text({"warmup_runs_seconds": [], "jit_cpu_s": {"warmup": [], "steady": [1.0]}}) == ""
    assert _warmup_text({}) == ""  # results written before the warm-up runs existed


def test_a_jit_figure_that_could_not_be_read_leaves_the_jit_out() -> None:
    # An engine on another machine: its JVM's threads are not in this machine's /proc.
    dedup = {"warmup_runs_seconds": [6.0], "jit_cpu_s": {"warmup": [None], "steady": [None]}}
    assert _warmup_text(dedup) == ": 1 unmeasured warm-up run took 6.00 s"


def test_the_jit_line_names_each_job_that_measured_it() -> None:
    from riverhouse_bench.sections import jit_lines

    runs = [
        ("riverhouse_dedup", {"jit_cpu_s": {"warmup": [5.0], "steady": [1.25, 2.0]}}),
        ("spark_plain", {"jit_cpu_s": {"warmup": [], "steady": [0.5]}}),
        ("older_result", {}),
    ]
    assert jit_lines(runs) == [
        "",
        "The JVM's JIT compiler threads' CPU seconds per run: riverhouse_dedup 5.0 in the warm-up runs, "
        "1.2, 2.0 in the steady runs; spark_plain 0.5 in the steady runs.",
    ]
    assert jit_lines([("spark_plain", {"jit_cpu_s": {"warmup": [], "steady": [None]}})]) == []


def test_the_join_note_gives_its_jit_cpu_per_run() -> None:
    from riverhouse_bench.sections import engine_notes

    join = {"jit_cpu_s": {"warmup": [3.54, 2.0], "steady": [1.0, 1.46]}}
    assert engine_notes("riverhouse_dedup_join", join, {}) == [
        "JIT compiler threads' CPU s per run: 3.5, 2.0 in the warm-up runs, 1.0, 1.5 in the steady runs"
    ]
    # An engine on another host: its JIT threads are not this machine's to read.
    assert engine_notes("riverhouse_dedup_join", {"jit_cpu_s": {"warmup": [], "steady": [None]}}, {}) == []
