"""`${env:NAME}` references in config values, resolved where a value is used.

Its own small module: the Kafka source resolves them in Spark's planner and worker
processes, and importing the spec model there (pydantic, YAML, sqlglot) cost each
streaming query start about 0.4 s.
"""

from __future__ import annotations

import os
import re
from typing import Any

ENV_REF_RE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def resolve_env_refs(value: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value

    def repl(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            from riverhouse.platform.spec import SpecError

            raise SpecError(where, [(where, f"environment variable {name} is not set", f"export {name}=...")])
        return os.environ[name]

    return ENV_REF_RE.sub(repl, value)
