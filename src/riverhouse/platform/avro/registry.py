"""A schema registry's Confluent-compatible REST API (Confluent Schema Registry, Apicurio's
`/apis/ccompat/v7`, Redpanda, Karapace): the versions of a subject and their schema ids.

Small (standard library only): the batch body imports it beside the engine (ingest/writer.py).
Credentials travel with the object (resolved from the spec's `${env:...}` references by the
run) and are never part of a message: errors name the registry by its URL, which may not hold
credentials (spec_avro.py refuses them there).
"""

from __future__ import annotations

import base64
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from riverhouse.platform.errors import PipelineError

TIMEOUT_S = 10.0
# A blip (a restart, a proxy's 503) is retried after these pauses; then the error is raised. Every
# request is safe to repeat: GETs, and a registration of the same schema answers the same id.
RETRY_PAUSES_S = (0.25, 1.0)
TRANSIENT_HTTP = frozenset({502, 503, 504})
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryError(PipelineError):
    """The registry refused a request or could not be reached; the message says which and what to do."""


class RegistryUnreachable(RegistryError):
    pass


@dataclass
class Registry:
    url: str  # the API's base, e.g. http://127.0.0.1:8081/apis/ccompat/v7
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    # schema id -> schema JSON text, for every version seen: what a record's id is decoded with.
    cache: dict[int, str] = field(default_factory=dict, repr=False)
    versions: dict[int, int] = field(default_factory=dict, repr=False)  # subject version -> schema id

    def _get(self, path: str, body: Any = None) -> Any:
        """GET `path`, or POST `body` (JSON) to it; a blip is retried (RETRY_PAUSES_S)."""
        for pause in RETRY_PAUSES_S:
            try:
                return self._request(path, body)
            except _Transient:
                time.sleep(pause)
        try:
            return self._request(path, body)
        except _Transient as last:
            raise last.error from None

    def _request(self, path: str, body: Any) -> Any:
        request = urllib.request.Request(f"{self.url.rstrip('/')}/{path}", headers={"Accept": CONTENT_TYPE})
        if body is not None:
            request.data = json.dumps(body).encode()
            request.add_header("Content-Type", CONTENT_TYPE)
        if self.username is not None:
            token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            # Unredirected: urllib copies add_header's headers to a redirect's target, which may be another host.
            request.add_unredirected_header("Authorization", f"Basic {token}")  # see _SameHostRedirects
        try:
            with _OPENER.open(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise RegistryError(
                    f"the schema registry at {self.url} refused the credentials (HTTP {exc.code}): check "
                    "schema_registry.auth"
                ) from None
            if exc.code == 404:
                raise RegistryError(f"the schema registry at {self.url} has no {path}") from None
            if exc.code in (409, 422):  # an incompatible or invalid schema: the registry says why
                raise RegistryError(
                    f"the schema registry at {self.url} refused the schema for {path} (HTTP {exc.code}): "
                    f"{_message(exc)}"
                ) from None
            if exc.code in TRANSIENT_HTTP:  # a proxy's answer: the registry behind it is down or restarting
                raise _Transient(self._unreachable(f"answered HTTP {exc.code} for {path}")) from None
            raise RegistryError(f"the schema registry at {self.url} answered HTTP {exc.code} for {path}") from None
        except http.client.HTTPException as exc:  # the answer broke off (IncompleteRead, a bad status line)
            raise _Transient(self._unreachable(f"its answer broke off: {type(exc).__name__}")) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):  # already waited TIMEOUT_S: not worth another wait
                raise self._unreachable(f"no answer in {TIMEOUT_S:.0f} s") from None
            raise _Transient(self._unreachable(reason)) from None
        except ValueError as exc:  # not JSON: not a registry's API
            raise RegistryUnreachable(
                f"the schema registry at {self.url} did not answer as a schema registry ({exc}); fix "
                "schema_registry.url (Apicurio's is .../apis/ccompat/v7)"
            ) from None

    def _unreachable(self, reason: object) -> RegistryUnreachable:
        return RegistryUnreachable(
            f"cannot reach the schema registry at {self.url} ({reason}); start it "
            "(`riverhouse registry start` for the local one) or fix schema_registry.url"
        )

    def register(self, subject: str, schema: str) -> int:
        """Register `schema` (JSON text) under `subject`, or find it there: its schema id."""
        found = self._get(f"subjects/{urllib.parse.quote(subject, safe='')}/versions", {"schema": schema})
        self.cache[int(found["id"])] = schema
        return int(found["id"])

    def schema(self, schema_id: int) -> str:
        """The schema JSON text with this id (cached)."""
        if schema_id not in self.cache:
            self.cache[schema_id] = self._get(f"schemas/ids/{int(schema_id)}")["schema"]
        return self.cache[schema_id]

    def latest_record_name(self, subject: str) -> str | None:
        """The record name of the subject's latest schema; None when the subject has no version."""
        found = self._latest(subject)
        if found is None:
            return None
        schema = json.loads(found[1])
        return schema.get("name") if isinstance(schema, dict) else None

    def latest(self, subject: str) -> tuple[int, str]:
        """(schema id, schema JSON) of the subject's latest version."""
        found = self._latest(subject)
        if found is None:
            raise RegistryError(
                f"the schema registry at {self.url} has no subject {subject!r}: register the topic's schema "
                "first (a producer does), set schema_registry.subject, or give the reader schema in avro_schema"
            )
        return found

    def _latest(self, subject: str) -> tuple[int, str] | None:
        """(schema id, schema JSON) of the subject's latest version (its schema kept in the cache); None when it has none."""
        try:
            found = self._get(f"subjects/{urllib.parse.quote(subject, safe='')}/versions/latest")
        except RegistryError as exc:
            if "has no subjects/" in str(exc):
                return None
            raise
        self.cache[int(found["id"])] = found["schema"]
        return int(found["id"]), found["schema"]

    def refresh(self, subject: str) -> dict[int, str]:
        """Every version of the subject (new ones fetched, known ones from the cache): id -> schema JSON."""
        quoted = urllib.parse.quote(subject, safe="")
        for version in self._get(f"subjects/{quoted}/versions"):
            known = self.versions.get(int(version))
            if known is None:
                found = self._get(f"subjects/{quoted}/versions/{int(version)}")
                known = int(found["id"])
                self.cache[known] = found["schema"]
                self.versions[int(version)] = known
        return dict(self.cache)


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """urllib drops an unredirected header (the credentials) on every redirect: put it back when the
    redirect stays on the same host and port (a trailing slash, http -> https), never for another."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        auth = req.unredirected_hdrs.get("Authorization")
        if new is not None and auth is not None:
            old, target = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(new.full_url)
            if (old.hostname, old.port) == (target.hostname, target.port) or (
                old.hostname == target.hostname
                and old.scheme == "http"
                and target.scheme == "https"
                and old.port in (None, 80)
                and target.port in (None, 443)
            ):
                new.add_unredirected_header("Authorization", auth)
        return new


_OPENER = urllib.request.build_opener(_SameHostRedirects)


class _Transient(Exception):
    """A failure worth one more try; `error` is what is raised when the tries are spent."""

    def __init__(self, error: RegistryError):
        super().__init__(str(error))
        self.error = error


def _message(exc: urllib.error.HTTPError) -> str:
    """The registry's own error message (Confluent's `message`), short."""
    try:
        return str(json.loads(exc.read()).get("message", ""))[:300] or "no reason given"
    except (ValueError, OSError, AttributeError):
        return "no reason given"
