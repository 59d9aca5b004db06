"""Where Riverhouse keeps its state, chosen once per process from flags and env.

Defaults put everything under `./.riverhouse/` so a newcomer needs no setup;
production points the warehouse at `s3://...` and the DSN at a ClickHouse server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


@dataclass(frozen=True)
class Settings:
    home: Path
    warehouse: str
    checkpoints: Path
    clickhouse_dsn: str
    kafka_state_dir: Path
    kafka_bootstrap: str | None = None  # overrides the spec's bootstrap_servers
    spark_master: str = "local[2]"
    spark_conf: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, home: str | Path | None = None) -> Settings:
        root = Path(home or os.environ.get("RIVERHOUSE_HOME", ".riverhouse")).resolve()
        return cls(
            home=root,
            warehouse=os.environ.get("RIVERHOUSE_WAREHOUSE", str(root / "warehouse")),
            checkpoints=Path(os.environ.get("RIVERHOUSE_CHECKPOINTS", str(root / "checkpoints"))),
            clickhouse_dsn=os.environ.get("RIVERHOUSE_CLICKHOUSE_DSN", f"chdb://{root / 'clickhouse'}"),
            kafka_state_dir=Path(os.environ.get("RIVERHOUSE_KAFKA_STATE", str(root / "kafka"))),
            kafka_bootstrap=os.environ.get("RIVERHOUSE_KAFKA_BOOTSTRAP") or None,
            spark_master=os.environ.get("RIVERHOUSE_SPARK_MASTER", "local[2]"),
        )

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced, safe to print or attach as metadata."""
    parts = urlsplit(dsn)
    if parts.password:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return dsn
