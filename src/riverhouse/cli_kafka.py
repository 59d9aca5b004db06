"""`riverhouse kafka start|stop|status|tail|archive`: the local Apache Kafka broker."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from riverhouse.cli_support import (
    BOOTSTRAP_HELP,
    HomeOption,
    err,
    fail,
    kafka_client_config,
    load_spec_or_fail,
    out,
    settings_for,
)
from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.runtime.spark import JavaMissingError
from riverhouse.platform.state.settings import Settings

kafka_app = typer.Typer(
    help="The local Kafka: a single-node Apache Kafka broker (KRaft) for development and demos.",
    no_args_is_help=True,
)


@kafka_app.command("start")
def kafka_start(
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="Also open a SASL_SSL listener (SCRAM-SHA-512) and an SSL listener requiring client "
            "certificates, with a throwaway CA under <home>/kafka/secure",
        ),
    ] = False,
    heap: Annotated[str, typer.Option(help="The broker JVM's maximum heap (-Xmx)")] = local_kafka.DEFAULT_HEAP,
    home: HomeOption = None,
) -> None:
    """Start the local Apache Kafka broker (KRaft, one node) in the background; data in <home>/kafka."""
    settings = settings_for(home)
    was_running = local_kafka.status(settings.kafka_state_dir)
    started = time.monotonic()
    if not was_running:
        err.print("starting the local Kafka broker (Apache Kafka, KRaft)...", highlight=False)
    try:
        state = local_kafka.start(settings.kafka_state_dir, secure=secure, heap=heap)
    except (local_kafka.LocalKafkaError, JavaMissingError) as exc:
        fail(str(exc))
    verb = "already running" if was_running else f"started in {time.monotonic() - started:.1f}s"
    out.print(f"local Kafka {verb}: bootstrap [bold]{state.bootstrap}[/] (pid {state.pid})", highlight=False)
    _print_listeners(state, settings)


def _secure_files(settings: Settings) -> dict[str, Path]:
    """What a client of the secure listeners needs (made at the first `kafka start --secure`)."""
    from riverhouse.platform.kafka import kafka_tls

    secure = settings.kafka_state_dir / "secure"
    return {
        "credentials": secure / kafka_tls.CREDENTIALS,
        "ca": secure / kafka_tls.CA,
        "client_certificate": secure / kafka_tls.CLIENT_CERT,
        "client_key": secure / kafka_tls.CLIENT_KEY,
    }


def _print_listeners(state: local_kafka.LocalKafkaState, settings: Settings) -> None:
    out.print(f"[dim]data and logs in {settings.kafka_state_dir}[/]", highlight=False)
    if state.secure:
        files = _secure_files(settings)
        out.print(
            f"  SASL_SSL {state.listeners['SASL_SSL']}  (SCRAM-SHA-512, user and password in "
            f"{files['credentials']}, CA {files['ca']})\n"
            f"  SSL      {state.listeners['SSL']}  (client certificate required: {files['client_certificate']}, "
            f"key {files['client_key']})",
            highlight=False,
        )


@kafka_app.command("stop")
def kafka_stop(home: HomeOption = None) -> None:
    """Stop the local Kafka broker (topics and offsets stay on disk for the next start)."""
    settings = settings_for(home)
    if local_kafka.stop(settings.kafka_state_dir):
        out.print("local Kafka stopped")
    else:
        out.print("local Kafka was not running")


@kafka_app.command("archive")
def kafka_archive() -> None:
    """Write the class-data archive local brokers start from; `make install` runs it.

    Starts a broker in a scratch folder and stops it: its JVM writes the classes its start loaded
    (~10 s). Run it again after changing the JDK or the jars.
    """
    err.print("writing the broker's class-data archive: a broker is started and stopped once...", highlight=False)
    started = time.monotonic()
    try:
        made = local_kafka.make_class_archive()
    except (local_kafka.LocalKafkaError, JavaMissingError) as exc:
        fail(f"no class-data archive for the broker: {exc}")
    if made is None:
        fail("no class-data archive for the broker: its JVM wrote none (see its log); brokers start without one")
    out.print(f"class-data archive: {made} ({time.monotonic() - started:.0f}s)", highlight=False)


@kafka_app.command("status")
def kafka_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON")] = False,
    home: HomeOption = None,
) -> None:
    """Print whether the local Kafka runs, and its addresses. Exit 1 when it does not."""
    settings = settings_for(home)
    state = local_kafka.status(settings.kafka_state_dir)
    report: dict[str, Any] = {"bootstrap": None, "source": "local", "running": False}
    if state:
        report = {
            "bootstrap": state.bootstrap,
            "source": "local",
            "running": True,
            "pid": state.pid,
            "uptime_s": round(time.time() - state.started_at),
            "listeners": state.listeners,  # PLAINTEXT; SASL_SSL and SSL when started --secure
            "secure_files": {k: str(v) for k, v in _secure_files(settings).items()} if state.secure else None,
        }
    report["state_dir"] = str(settings.kafka_state_dir)
    if as_json:
        print(json.dumps(report), flush=True)
    elif state:
        out.print(
            f"local Kafka running: bootstrap {state.bootstrap} (pid {state.pid}, up {report['uptime_s']}s)",
            highlight=False,
        )
        _print_listeners(state, settings)
    else:
        out.print("local Kafka is not running (start it with `riverhouse kafka start`)")
    if not report["running"]:
        raise typer.Exit(1)


@kafka_app.command("tail")
def kafka_tail(
    topic: Annotated[str, typer.Argument(help="The topic to read (e.g. a Kafka sink's)")],
    max_records: Annotated[
        int, typer.Option("--max", help="Stop after this many records (0: all of them)", min=0)
    ] = 100,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep reading new records until Ctrl-C")] = False,
    count: Annotated[
        bool, typer.Option("--count", help="Print only how many records there are, per Delta version (header)")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per record")] = False,
    spec_file: Annotated[
        Path | None,
        typer.Option(
            "--spec", help="Connect as this pipeline's runs do (its bootstrap servers, kafka.security, kafka.config)"
        ),
    ] = None,
    bootstrap: Annotated[str | None, typer.Option(help=BOOTSTRAP_HELP)] = None,
    home: HomeOption = None,
) -> None:
    """Read a topic from its start as a read_committed consumer does: rows of aborted transactions never show."""
    from riverhouse.platform.errors import PipelineError
    from riverhouse.platform.kafka.client import KafkaSourceError
    from riverhouse.platform.kafka.tail import BEGINNING, count_by_header, read_committed
    from riverhouse.platform.sink.topic import VERSION_HEADER
    from riverhouse.platform.spec_base import SpecError

    spec = None if spec_file is None else load_spec_or_fail(spec_file)
    config, _ = kafka_client_config(settings_for(home), spec, bootstrap)
    try:
        decode = _avro_decoder(spec, topic)
        records = read_committed(config, topic, BEGINNING, follow=follow and not count)
        if count:
            counts = count_by_header(records, VERSION_HEADER)
            total = sum(counts.values())
            if as_json:
                print(json.dumps({"topic": topic, "records": total, "by_version": counts}))
                return
            out.print(f"{total:,} committed records in {topic}", highlight=False)
            for version, n in sorted(counts.items(), key=lambda kv: (len(kv[0]), kv[0])):
                out.print(f"  Delta version {version or '(no header)'}: {n:,}", highlight=False)
            return
        for shown, record in enumerate(records):
            if max_records and shown >= max_records:
                err.print(f"(stopped after {max_records} records: --max 0 reads them all)", highlight=False)
                break
            _print_record(record, as_json, decode)
    except (KafkaSourceError, PipelineError, SpecError) as exc:  # PipelineError: the registry an Avro value needs
        fail(str(exc))
    except KeyboardInterrupt:
        pass


def _avro_decoder(spec: Any, topic: str) -> Any:
    """The spec's Kafka sink writes `topic` as Avro: values are decoded through its registry."""
    sink = next((s for s in spec.topic_sinks if s.topic == topic), None) if spec is not None else None
    if sink is None or sink.schema_registry is None:
        return None
    from riverhouse.platform.sink.topic_avro import decoder

    return decoder(sink.schema_registry.client())


def _print_record(record: Any, as_json: bool, decode: Any = None) -> None:
    def text(value: bytes | None) -> str | None:
        return None if value is None else value.decode("utf-8", errors="replace")

    value = None if record.value is None else (decode or text)(record.value)

    if as_json:
        headers = {k: text(v) for k, v in record.headers.items()}
        print(
            json.dumps(
                {
                    "partition": record.partition,
                    "offset": record.offset,
                    "key": text(record.key),
                    "value": value,
                    "headers": headers,
                }
            ),
            flush=True,
        )
        return
    version = record.headers.get("riverhouse.version")
    label = f"p{record.partition}@{record.offset}" + (f" v{version.decode()}" if version else "")
    print(f"{label} key={text(record.key)} {value}", flush=True)
