"""`${env:NAME}` references in config values, resolved where a value is used.

Specs are written by many teams and loaded by one platform that holds the platform's
own credentials (the ClickHouse DSN, storage keys...). A spec may therefore read only
variables whose name starts with the operator's prefix (RIVERHOUSE_SPEC_ENV_PREFIX,
default RIVERHOUSE_SECRET_): `${env:RIVERHOUSE_CLICKHOUSE_DSN}` is refused, both when
the spec is validated and when the value is resolved (defence in depth: the Kafka source
resolves them again in Spark's planner and worker processes). And only credential
settings (`accepts_env_ref`) may hold a reference, so a secret is not sent as, say, a
`client.id` to whatever broker the spec names.

Its own small module: the Kafka source resolves them in Spark's planner and worker
processes, and importing the spec model there (pydantic, YAML, sqlglot) cost each
streaming query start about 0.4 s.
"""

from __future__ import annotations

import os
import re
from typing import Any

ENV_REF_RE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
# Anything that looks like a reference, well-formed or not: a malformed one is refused
# rather than passed on as literal text.
ANY_REF_RE = re.compile(r"\$\{env:[^}]*\}?")
PREFIX_VARIABLE = "RIVERHOUSE_SPEC_ENV_PREFIX"
DEFAULT_PREFIX = "RIVERHOUSE_SECRET_"
SECRET_HINTS = ("password", "secret", "token", "key", "credential", "jaas", "oauthbearer.config", "passphrase")
# Credential settings that are not secret themselves but may come from the environment.
ENV_REF_IDENTITY_KEYS = {"sasl.username", "sasl.oauthbearer.client.id"}


def is_secret_key(key: str) -> bool:
    lowered = key.lower()
    return any(h in lowered for h in SECRET_HINTS) and not lowered.endswith(".location")


def accepts_env_ref(key: str) -> bool:
    """May this kafka.config setting take its value from `${env:NAME}`? Credentials only."""
    return is_secret_key(key) or key in ENV_REF_IDENTITY_KEYS


def allowed_prefix() -> str:
    """The prefix a spec's `${env:NAME}` must start with (the operator sets it; never empty)."""
    return os.environ.get(PREFIX_VARIABLE, "").strip() or DEFAULT_PREFIX


def env_ref_problems(value: Any) -> list[str]:
    """Why the references in `value` may not be used (empty when they may)."""
    if not isinstance(value, str):
        return []
    problems = []
    prefix = allowed_prefix()
    for match in ANY_REF_RE.finditer(value):
        good = ENV_REF_RE.fullmatch(match.group(0))
        if good is None:
            problems.append(f"{match.group(0)!r} is not a valid reference: write ${{env:NAME}}")
        elif not good.group(1).startswith(prefix):
            problems.append(
                f"${{env:{good.group(1)}}} is not allowed: a spec may read only environment variables "
                f"whose name starts with {prefix} (set by the operator in {PREFIX_VARIABLE})"
            )
    return problems


def resolve_env_refs(value: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value
    from riverhouse.platform.spec import SpecError

    problems = env_ref_problems(value)
    if problems:
        raise SpecError(where, [(where, problem, "") for problem in problems])

    def repl(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise SpecError(where, [(where, f"environment variable {name} is not set", f"export {name}=...")])
        return os.environ[name]

    return ENV_REF_RE.sub(repl, value)
