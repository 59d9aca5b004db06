"""One call on a thread of its own, its result a Future: work that overlaps the caller's."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


def in_background(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
    """Run `fn(*args, **kwargs)` on a new thread named after `name`; the caller waits on the Future
    (its `result()` raises what `fn` raised). The thread ends with the call."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return pool.submit(fn, *args, **kwargs)
    finally:
        pool.shutdown(wait=False)
