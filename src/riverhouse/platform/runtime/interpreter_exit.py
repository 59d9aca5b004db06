"""A Riverhouse process skips the interpreter's last full garbage collection as it exits.

As CPython shuts down it tears its modules down and runs a full collection over every object
still alive. A process that imported Dagster, Great Expectations, pyspark's Connect client,
pandas and chDB (a run, the demo, a Dagster run worker) holds a few hundred thousand of them,
and that collection took 1.3 s of CPU after the command's work was done (bench/analysis.md,
"Processes that end faster"). `gc.freeze()` as the last exit handler moves them all to the permanent
generation, which collections skip: the exit took 0.2 s. Only reference cycles among those
objects go unfreed, and the process is ending: the system takes its memory back, files are closed
by their owners, and other exit handlers (registered later, so run before this one) still run.
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def skip_final_collection() -> None:
    """Freeze every object as the process exits (idempotent; call it early: exit handlers run
    last-registered first, so this one runs after those of modules imported later)."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True
