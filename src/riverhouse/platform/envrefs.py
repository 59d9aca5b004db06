"""`${env:NAME}` references in config values, resolved where a value is used.

Specs are written by many teams and loaded by one platform that holds the platform's
own credentials (the ClickHouse DSN, storage keys...) and every team's secrets. So:

- a spec may read only variables whose name starts with the operator's prefix
  (RIVERHOUSE_SPEC_ENV_PREFIX, default RIVERHOUSE_SECRET_): `${env:RIVERHOUSE_CLICKHOUSE_DSN}`
  is refused, both when the spec is validated and when the value is resolved;
- and only the variables bound to its pipeline (`scope_problems`): those named
  `<prefix><PIPELINE>__<NAME>` (the pipeline's name in upper case, two underscores, then a
  name without a double underscore, so that no pipeline's names are another's: `orders` has
  RIVERHOUSE_SECRET_ORDERS__PASSWORD, `orders_dedup` RIVERHOUSE_SECRET_ORDERS_DEDUP__PASSWORD),
  plus any the operator binds to it in the file named by RIVERHOUSE_SECRET_BINDINGS
  (`pipeline: [VARIABLE, ...]`), for a secret several pipelines share;
- and only in secret settings (kafka.security's username and password, kafka.config's
  `ssl.key.password`), never in a setting that names a host or URL, so a secret is not sent
  as, say, a `client.id` or a token endpoint to whatever server the spec names.

Its own small module: the Kafka options are resolved in Spark's planner processes, and
importing the spec model there (pydantic, YAML, sqlglot) cost each streaming query start
about 0.4 s.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

ENV_REF_RE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
# Anything that looks like a reference, well-formed or not: a malformed one is refused
# rather than passed on as literal text.
ANY_REF_RE = re.compile(r"\$\{env:[^}]*\}?")
PREFIX_VARIABLE = "RIVERHOUSE_SPEC_ENV_PREFIX"
DEFAULT_PREFIX = "RIVERHOUSE_SECRET_"
BINDINGS_VARIABLE = "RIVERHOUSE_SECRET_BINDINGS"
# The part after `<prefix><PIPELINE>__`: no leading, trailing or double underscore, so the split is unique.
SECRET_NAME_RE = re.compile(r"[A-Z0-9]+(?:_[A-Z0-9]+)*")


def allowed_prefix() -> str:
    """The prefix a spec's `${env:NAME}` must start with (the operator sets it; never empty)."""
    return os.environ.get(PREFIX_VARIABLE, "").strip() or DEFAULT_PREFIX


def env_ref_problems(value: Any) -> list[str]:
    """Why the references in `value` may not be used by any spec (empty when they may): malformed, or
    outside the operator's prefix. A pipeline's own scope is `scope_problems`."""
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
    from riverhouse.platform.spec_base import SpecError

    problems = env_ref_problems(value)
    if problems:
        raise SpecError(where, [(where, problem, "") for problem in problems])

    def repl(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise SpecError(where, [(where, f"environment variable {name} is not set", f"export {name}=...")])
        return os.environ[name]

    return ENV_REF_RE.sub(repl, value)


def referenced_names(value: Any) -> list[str]:
    return ENV_REF_RE.findall(value) if isinstance(value, str) else []


def pipeline_prefix(pipeline: str) -> str:
    """The start of the variables that belong to `pipeline` by name: RIVERHOUSE_SECRET_<PIPELINE>__."""
    return f"{allowed_prefix()}{pipeline.upper()}__"


def bound_variables(pipeline: str) -> set[str]:
    """Variables the operator's bindings file (RIVERHOUSE_SECRET_BINDINGS) binds to `pipeline`.

    Raises ValueError naming the file when it cannot be used: a binding the operator meant must
    not silently vanish.
    """
    path = os.environ.get(BINDINGS_VARIABLE, "").strip()
    if not path:
        return set()
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"the secret bindings file {BINDINGS_VARIABLE}={path} cannot be read: {exc}") from None
    if data is None:
        return set()
    if not isinstance(data, dict) or not all(
        isinstance(v, list) and all(isinstance(n, str) for n in v) for v in data.values()
    ):
        raise ValueError(f"{BINDINGS_VARIABLE}={path} must map pipeline names to lists of variable names")
    names = set(data.get(pipeline) or [])
    prefix = allowed_prefix()
    if stray := sorted(n for n in names if not n.startswith(prefix)):
        raise ValueError(
            f"{BINDINGS_VARIABLE}={path} binds {', '.join(stray)} to {pipeline}: bound names start with {prefix}"
        )
    return names


def scope_problems(value: Any, pipeline: str) -> list[str]:
    """Why the references in `value` may not be used by the spec of `pipeline` (empty when they may)."""
    problems = []
    own = pipeline_prefix(pipeline)
    for name in referenced_names(value):
        if not name.startswith(allowed_prefix()):
            continue  # env_ref_problems names it
        if name.startswith(own) and SECRET_NAME_RE.fullmatch(name[len(own) :]):
            continue
        try:
            bound = bound_variables(pipeline)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if name not in bound:
            problems.append(
                f"${{env:{name}}} is not bound to pipeline {pipeline!r}: a pipeline reads the variables named "
                f"{own}<NAME> (e.g. {own}KAFKA_PASSWORD) and those the operator binds to it in {BINDINGS_VARIABLE}"
            )
    return problems
