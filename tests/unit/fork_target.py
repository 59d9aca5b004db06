"""A worker module for tests/unit/test_worker_fork.py: says where it runs, then ends as its environment asks."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

if __name__ == "__main__":
    seen = {"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "value": os.environ.get("FORK_TARGET_VALUE")}
    seen["sigint"] = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    seen["stdin"] = sys.stdin.readline().strip()
    print(json.dumps(seen), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if os.environ.get("FORK_TARGET_SLEEP"):
        time.sleep(float(os.environ["FORK_TARGET_SLEEP"]))
    sys.exit(int(os.environ.get("FORK_TARGET_CODE", "0")))
