"""Issue 27, item 9: a supervised command and everything it started stop together on SIGTERM or SIGINT.

A stand-in tree of real processes, built to be hard to stop: the command exits on SIGTERM without
stopping its children (what left `dagster dev`'s code server, webserver and daemon running), one
child ignores SIGTERM, and one grandchild double-forks into a new session, leaving the tree by
its parent. A "broker" the caller stops itself comes last. tests/integration/test_ui_stop.py
does the same with the real `riverhouse ui`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TREE = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    out = sys.argv[1]
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
    daemonize = [sys.executable, "-c", (
        "import os, subprocess, sys, time\\n"
        "d = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\\n"
        "open(sys.argv[1], 'w').write(str(d.pid))\\n"
    ), out + ".daemon"]
    children = [subprocess.Popen(sleeper), subprocess.Popen(stubborn), subprocess.Popen(daemonize)]
    children[2].wait()  # its child lives on in a session of its own, its parent gone
    while not os.path.exists(out + ".daemon"):
        time.sleep(0.05)
    pids = [os.getpid(), children[0].pid, children[1].pid, int(open(out + ".daemon").read())]
    open(out + ".tmp", "w").write(json.dumps(pids)); os.replace(out + ".tmp", out)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # exits, leaving its children behind
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))
    time.sleep(600)
    """
)
SUPERVISOR = textwrap.dedent(
    """
    import subprocess, sys, os
    from riverhouse.platform.runtime.process_tree import run_until_signalled
    tree, out = sys.argv[1], sys.argv[2]
    broker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    open(out + ".broker", "w").write(str(broker.pid))
    def stop_broker():
        broker.terminate(); broker.wait()
        open(out + ".stopped", "w").write("broker stopped last")
    sys.exit(run_until_signalled([sys.executable, tree, out], dict(os.environ), {broker.pid}, stop_broker, grace_s=3))
    """
)


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finding a process tree needs Linux's /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_whole_tree_and_the_broker_last(tmp_path: Path, signum: int) -> None:
    (tmp_path / "tree.py").write_text(TREE)
    out = tmp_path / "pids.json"
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(tmp_path / "tree.py"), str(out)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    deadline = time.monotonic() + 60
    while not out.exists():
        assert supervisor.poll() is None and time.monotonic() < deadline, "the stand-in tree did not start"
        time.sleep(0.1)
    pids = [*json.loads(out.read_text()), int(Path(f"{out}.broker").read_text())]
    assert all(running(p) for p in pids)
    supervisor.send_signal(signum)
    assert supervisor.wait(timeout=60) == 0
    assert [p for p in pids if running(p)] == []
    assert Path(f"{out}.stopped").read_text() == "broker stopped last"
