"""How long a Spark Connect client waits for an engine that does not answer, and when it stops.

pyspark's default retries an unreachable server for 10 minutes or more: a run whose engine died
would hang that long. Riverhouse's policy rides out a hiccup of about 25 s (backoff 0.05 s x4 up
to 10 s, 6 retries), and once one call has waited that long in vain it gives up for the rest of
the process: the run is failing, and every later call (stopping the query, releasing results,
pyspark's own clean-up at exit) would otherwise wait its own 25 s first (a run whose engine was
killed took 75 s longer to exit than to report it).
"""

from __future__ import annotations

from typing import Any

ENGINE_RETRIES = 6
ENGINE_MAX_BACKOFF_MS = 10_000


def engine_retry_policy() -> Any:
    """A fresh policy for one client (pyspark is imported here, not when Riverhouse is)."""
    from pyspark.sql.connect.client.retries import DefaultPolicy, RetryPolicyState

    class _State(RetryPolicyState):
        def next_attempt(self, exception: BaseException | None = None) -> int | None:
            wait = super().next_attempt(exception)
            if wait is None:  # this call's retries are spent: the engine is gone
                self.policy.gave_up = True
            return wait

    class EnginePolicy(DefaultPolicy):
        def __init__(self) -> None:
            super().__init__(max_retries=ENGINE_RETRIES, max_backoff=ENGINE_MAX_BACKOFF_MS)
            self.gave_up = False

        def can_retry(self, e: BaseException) -> bool:
            return not self.gave_up and super().can_retry(e)

        def to_state(self) -> RetryPolicyState:
            return _State(self)

    return EnginePolicy()
