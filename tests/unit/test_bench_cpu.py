"""The bench's CPU meter: a child's CPU time is counted, also after the child has ended."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from riverhouse_bench.metering import CpuMeter

pytestmark = pytest.mark.unit

BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end:\n    pass\n"


def test_cpu_of_a_child_that_ended_inside_the_window_is_counted() -> None:
    with CpuMeter(interval_s=0.05) as meter:
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", BURN.format(s=0.6)], check=True)
        time.sleep(0.2)  # an idle stretch: wall time grows, CPU does not
        ended = time.monotonic()
    window = meter.window(started, ended)
    # The child ran ~0.6 s of CPU (its interpreter start adds a little, sampling loses < 0.05 s).
    assert 0.45 <= window["by_role"]["other"] <= 1.2, window
    assert window["wall_s"] >= 0.8
    assert 0 < window["utilization"] <= 1.0


def test_a_window_before_the_work_sees_none_of_it() -> None:
    with CpuMeter(interval_s=0.05) as meter:
        time.sleep(0.3)
        quiet_end = time.monotonic()
        subprocess.run([sys.executable, "-c", BURN.format(s=0.4)], check=True)
    quiet = meter.window(meter.samples[0][0], quiet_end - 0.06)
    assert quiet["by_role"]["other"] == 0.0, quiet
