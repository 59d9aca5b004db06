"""Object storage for the driver's own reads (the Delta log, the files a commit added).

Spark reaches the warehouse through Hadoop's file systems (S3A); the driver's small reads go
through pyarrow with the same credentials: `RIVERHOUSE_STORAGE_OPTIONS` (JSON, delta-rs style
keys such as AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL,
AWS_ALLOW_HTTP), else the provider's usual chain (environment, profile, instance role).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow.fs as pafs


def storage_options() -> dict[str, str]:
    raw = os.environ.get("RIVERHOUSE_STORAGE_OPTIONS")
    if not raw:
        return {}
    value = json.loads(raw)
    return {str(k).upper(): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def object_store(uri: str) -> tuple[pafs.FileSystem, str]:
    """(file system, path within it) for an `s3://`, `gs://`... URI."""
    options = storage_options()
    if uri.startswith("s3://"):
        kwargs: dict[str, Any] = {}
        if "AWS_ACCESS_KEY_ID" in options:
            kwargs["access_key"] = options["AWS_ACCESS_KEY_ID"]
            kwargs["secret_key"] = options.get("AWS_SECRET_ACCESS_KEY", "")
            if "AWS_SESSION_TOKEN" in options:
                kwargs["session_token"] = options["AWS_SESSION_TOKEN"]
        if "AWS_REGION" in options:
            kwargs["region"] = options["AWS_REGION"]
        endpoint = options.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            scheme, _, rest = endpoint.partition("://")
            kwargs["endpoint_override"] = rest or endpoint
            kwargs["scheme"] = scheme if rest else "https"
        bucket_and_path = uri[len("s3://") :]
        return pafs.S3FileSystem(**kwargs), bucket_and_path
    return pafs.FileSystem.from_uri(uri)
