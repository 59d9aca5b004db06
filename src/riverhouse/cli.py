"""`riverhouse ...`: validate specs, run the local Kafka, generate events, run pipelines, demo, UI."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from riverhouse.cli_demo import demo
from riverhouse.cli_support import (
    BOOTSTRAP_HELP,
    EngineOption,
    HomeOption,
    err,
    fail,
    guarded,
    kafka_client_config,
    load_spec_or_fail,
    out,
    print_summary,
    require_kafka,
    settings_for,
    start_local_engine,
)
from riverhouse.cli_validate import validate
from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.runtime import engine, processes
from riverhouse.platform.runtime.interpreter_exit import skip_final_collection
from riverhouse.platform.state.settings import redact_dsn

app = typer.Typer(
    help="Riverhouse: Kafka -> deduplicated Delta tables -> ClickHouse, exactly once.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(wanted: bool) -> None:
    if not wanted:
        return
    try:
        version = importlib.metadata.version("riverhouse")
    except importlib.metadata.PackageNotFoundError:
        fail("riverhouse is not installed (no package metadata): install it with `pip install -e .` in the clone")
    out.print(f"riverhouse {version}", highlight=False)
    raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the installed version and exit", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    """Riverhouse: Kafka -> deduplicated Delta tables -> ClickHouse, exactly once."""


app.command()(validate)  # first in --help
app.command()(demo)


# ---------------------------------------------------------------------------- generate
def _produce_with_progress(
    bootstrap: str,
    topic: str,
    kind: str,
    cfg: Any,
    rate: float | None,
    quiet: bool = False,
    client_config: dict[str, Any] | None = None,
    avro: tuple[Any, int] | None = None,
) -> dict[str, Any]:
    from riverhouse.platform.kafka.generator import GENERATORS, produce

    records, stats = GENERATORS[kind](cfg)
    if avro is not None:
        from riverhouse.platform.avro.produce import as_avro

        records = as_avro(records, *avro)
    # Only orders have a count known up front (user events depend on the user population).
    total = cfg.count + round(cfg.count * cfg.duplicate_rate) + cfg.malformed if kind == "orders" else None
    with Progress(
        TextColumn("producing to [bold]{task.fields[topic]}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=quiet,
        transient=False,
    ) as progress:
        task = progress.add_task("produce", total=total, topic=topic)
        produce(
            bootstrap,
            topic,
            records,
            rate=rate,
            on_progress=lambda n: progress.advance(task, n),
            producer_extra=client_config,
        )
    return stats.as_dict() | {"topic": topic}  # the generator names its kind's default topic


@app.command()
def generate(
    topic: Annotated[str, typer.Option(help="Topic to produce to")] = "orders",
    kind: Annotated[str, typer.Option(help="orders | user_events | user_tiers")] = "orders",
    count: Annotated[int, typer.Option(help="Distinct events")] = 10_000,
    duplicate_rate: Annotated[float, typer.Option(help="Extra duplicate copies, fraction of count")] = 0.10,
    out_of_order: Annotated[float, typer.Option(help="Fraction of events with an earlier event time")] = 0.05,
    malformed: Annotated[int, typer.Option(help="Malformed records to add")] = 10,
    rate: Annotated[float | None, typer.Option(help="Messages per second (default: as fast as possible)")] = None,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same events)")] = 42,
    partitions: Annotated[
        int,
        typer.Option(
            help="Create the topic with this many partitions when it does not exist yet "
            f"(an existing topic keeps its own; auto-created topics get {local_kafka.DEFAULT_PARTITIONS})",
            min=1,
            max=1000,
        ),
    ] = local_kafka.DEFAULT_PARTITIONS,
    bootstrap: Annotated[str | None, typer.Option(help=BOOTSTRAP_HELP)] = None,
    spec_file: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="Produce where this pipeline reads, connected as its runs are: its kafka.security and "
            "kafka.config, and its bootstrap servers unless --bootstrap or RIVERHOUSE_KAFKA_BOOTSTRAP names others",
        ),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="json | avro (Confluent wire format, schema registered in --registry)")
    ] = "json",
    registry: Annotated[
        str | None, typer.Option(help="Schema registry API for --format avro (default: the local registry's)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON")] = False,
    home: HomeOption = None,
) -> None:
    """Produce synthetic orders or user events with duplicates, late and malformed records."""
    from riverhouse.platform.kafka.generator import GENERATORS, GeneratorConfig

    if kind not in GENERATORS:
        fail(f"--kind must be one of {', '.join(GENERATORS)}, got {kind!r}")
    try:
        cfg = GeneratorConfig(
            count=count, duplicate_rate=duplicate_rate, out_of_order=out_of_order, malformed=malformed, seed=seed
        )
    except ValueError as exc:
        fail(str(exc))
    settings = settings_for(home)
    spec = None if spec_file is None else load_spec_or_fail(spec_file)
    config, source = kafka_client_config(settings, spec, bootstrap)
    # One quick metadata request first: a broker that is not there is named in seconds, with what
    # to do, instead of by the topic creation's timeout.
    require_kafka(config, source, settings)
    address = config.pop("bootstrap.servers")
    avro = _avro_target(fmt, registry, topic, kind, home)
    started = time.monotonic()
    try:
        local_kafka.create_topic(address, topic, partitions, config)
        stats = _produce_with_progress(address, topic, kind, cfg, rate, quiet=as_json, client_config=config, avro=avro)
    except typer.Exit:
        raise
    except Exception as exc:
        fail(f"producing to {topic!r} at {address} failed: {str(exc) or type(exc).__name__}")
    stats["seconds"] = round(time.monotonic() - started, 3)
    if as_json:
        print(json.dumps(stats))
    else:
        out.print(
            f"produced {stats['messages']} messages to {topic}: {stats['unique']} distinct, "
            f"{stats['duplicates']} duplicates, {stats['malformed']} malformed, "
            f"{stats['out_of_order']} out of order ({stats['seconds']}s)",
            highlight=False,
        )


def _avro_target(fmt: str, registry: str | None, topic: str, kind: str, home: Path | None) -> tuple[Any, int] | None:
    """(schema, schema id) to produce Avro with, registered under <topic>-value; None for JSON."""
    if fmt not in ("json", "avro"):
        fail(f"--format must be json or avro, got {fmt!r}")
    if fmt == "json":
        return None
    from riverhouse.cli_registry import registry_dir
    from riverhouse.platform.avro import local_registry
    from riverhouse.platform.avro.produce import SCHEMAS, register

    if registry is None:
        state = local_registry.status(registry_dir(home))
        if state is None:
            fail(
                "--format avro needs a schema registry: start the local one (`riverhouse registry start`) or give --registry"
            )
        registry = state.api
    try:
        return SCHEMAS[kind], register(registry, f"{topic}-value", SCHEMAS[kind])
    except OSError as exc:
        fail(f"registering the {kind} schema at {registry} failed: {exc}")
        raise AssertionError("unreachable") from None


# ---------------------------------------------------------------------------- run
@app.command()
def run(
    spec_file: Annotated[Path, typer.Argument(help="Pipeline spec (YAML)")],
    skip_load: Annotated[bool, typer.Option("--skip-load", help="Stop after the Delta tables")] = False,
    drain: Annotated[
        bool,
        typer.Option(
            "--drain",
            help="Join pipelines: close every pending window now (use when the input is complete: replays, backfills)",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON")] = False,
    continuous: Annotated[
        bool,
        typer.Option(
            "--continuous",
            help="Keep running (a micro-batch every orchestration.trigger_interval) until "
            "Ctrl-C or SIGTERM, which stop after the current batch",
        ),
    ] = False,
    home: HomeOption = None,
) -> None:
    """Run a pipeline: everything now in Kafka -> Delta (bronze/silver/gold) -> ClickHouse, once or --continuous."""
    from riverhouse.platform.pipeline import Pipeline

    settings = settings_for(home)
    spec = load_spec_or_fail(spec_file)
    log = (lambda m: None) if as_json else (lambda m: err.print(m, highlight=False))
    if continuous:
        # A long-running process always reports progress (on stderr; --json keeps stdout for the summary).
        log = lambda m: err.print(m, highlight=False)  # noqa: E731
        if drain:
            fail("--drain closes every join window, which a continuous run must not do; run without it")
        stop = threading.Event()

        def request_stop(signum: int, frame: Any) -> None:
            if stop.is_set():
                return
            err.print(
                f"received {signal.Signals(signum).name}: finishing the current batch, then stopping", highlight=False
            )
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        summary = guarded(lambda: Pipeline(spec, settings, log=log).continuous(stop, load=not skip_load))
    else:
        summary = guarded(lambda: Pipeline(spec, settings, log=log).run(load=not skip_load, drain=drain))
    if as_json:
        print(json.dumps(summary, default=str))
    else:
        print_summary(f"pipeline {spec.name}", summary)


# ---------------------------------------------------------------------------- bench
BENCH_PACKAGE = "riverhouse_bench"


def bench_folder() -> Path | None:
    """The repository's bench/ folder (it holds the riverhouse_bench package), or None outside a clone.

    The benchmarks are not part of the installed product: a source checkout (editable
    install) has them next to src/, and the current folder may be a clone too.
    """
    for repo in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (repo / "bench" / BENCH_PACKAGE / "__main__.py").is_file():
            return repo / "bench"
    return None


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
)
def bench(ctx: typer.Context) -> None:
    """Benchmark every scenario (= make bench); options: riverhouse bench --help. Needs a clone's bench/ folder."""
    folder = bench_folder()
    if folder is None:
        fail(
            "the benchmarks are not part of the installed riverhouse package: they live in the repository's "
            f"bench/ folder ({BENCH_PACKAGE}). Run `make bench` in a clone of the repository, or "
            f"`python -m {BENCH_PACKAGE}` with that folder on PYTHONPATH."
        )
        return
    import subprocess

    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    # A process of its own: the product never imports the bench; every option is the bench's.
    ran = subprocess.run([sys.executable, "-m", BENCH_PACKAGE, *ctx.args], env={**os.environ, "PYTHONPATH": path})
    raise typer.Exit(ran.returncode)


# ---------------------------------------------------------------------------- reset
@app.command()
def reset(
    pipeline: Annotated[str, typer.Argument(help="Pipeline spec file, or a pipeline name in --pipelines")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation")] = False,
    pipelines: Annotated[
        Path | None, typer.Option(help="Folder of pipeline specs (default: $RIVERHOUSE_PIPELINES or ./pipelines)")
    ] = None,
    home: HomeOption = None,
) -> None:
    """Delete one pipeline's Delta tables, checkpoints, ClickHouse table and ledger rows; it restarts from Kafka."""
    from riverhouse.platform.pipeline import Pipeline
    from riverhouse.platform.spec import load_spec_folder
    from riverhouse.platform.state.reset import ResetError

    settings = settings_for(home)
    if Path(pipeline).is_file():
        spec = load_spec_or_fail(Path(pipeline))
    else:
        folder = pipelines or Path(os.environ.get("RIVERHOUSE_PIPELINES", "pipelines"))
        found = [s for s in load_spec_folder(folder)[0] if s.name == pipeline]
        if not found:
            fail(f"no spec file {pipeline!r}, and no valid spec named {pipeline!r} in {folder}")
        spec = found[0]
    target = Pipeline(spec, settings, log=lambda m: err.print(m, highlight=False, markup=False))
    try:
        plan = target.reset_plan()
    except ResetError as exc:
        fail(str(exc))
    err.print(f"reset pipeline [bold]{spec.name}[/] (its data is read again from Kafka on the next run):")
    for line in plan.describe():
        err.print(f"  {line}", highlight=False, markup=False)
    if not yes:
        if not sys.stdin.isatty():
            fail("not confirmed: pass --yes to reset without a question")
        if not typer.confirm("Reset?", default=False, err=True):
            fail("not reset")
    try:
        guarded(target.reset)
    except ResetError as exc:
        fail(str(exc))
    out.print(f"pipeline {spec.name} reset", highlight=False)


# ---------------------------------------------------------------------------- ui
@app.command()
def ui(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1")] = 3000,
    pipelines: Annotated[Path, typer.Option(help="Folder of pipeline specs")] = Path("pipelines"),
    use_engine: EngineOption = True,
    home: HomeOption = None,
) -> None:
    """Start the local Kafka, the engine and the Dagster UI on 127.0.0.1; Ctrl-C (or SIGTERM) stops them all.

    Stopping takes `dagster dev` down first (with its code server, webserver and daemon), then
    anything of its process tree still running (runs in flight included), then the engine and
    the local Kafka, each if this command started it.
    """
    settings = settings_for(home)
    dagster = shutil.which("dagster", path=str(Path(sys.executable).parent)) or shutil.which("dagster")
    if not dagster:
        fail("the dagster command was not found in this environment; reinstall riverhouse")
    assert dagster is not None
    if not processes.port_free(port):
        fail(f"port {port} is taken by another process: choose another with --port")
    kafka_was_running = local_kafka.status(settings.kafka_state_dir) is not None
    try:
        state = local_kafka.start(settings.kafka_state_dir)
    except local_kafka.LocalKafkaError as exc:
        fail(str(exc))
    where, engine_started = start_local_engine(settings, use_engine)
    from riverhouse.deploy import local_dagster_home

    dagster_home = local_dagster_home(settings.home / "dagster")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home),
        "RIVERHOUSE_HOME": str(settings.home),
        "RIVERHOUSE_PIPELINES": str(pipelines.resolve()),
    }
    err.print(f"local Kafka at {state.bootstrap}; ClickHouse {redact_dsn(settings.clickhouse_dsn)}", highlight=False)
    err.print(f"engine: {where}", highlight=False)
    err.print(f"Dagster UI on http://127.0.0.1:{port} (Ctrl-C to stop)")
    from riverhouse.platform.runtime.process_tree import run_until_signalled

    running_engine = engine.status(settings.engine_state_dir)
    # Stopped last, each by its own clean shutdown (never as a leftover of dagster's tree).
    keep = {state.pid, *([running_engine.pid] if running_engine else [])}

    def stop_started() -> None:
        if engine_started:
            engine.stop(settings.engine_state_dir)
            err.print("engine stopped", highlight=False)
        if kafka_was_running:
            err.print("the local Kafka keeps running (it ran before `riverhouse ui`); `riverhouse kafka stop`")
        elif local_kafka.stop(settings.kafka_state_dir):
            err.print("local Kafka stopped", highlight=False)

    if not processes.port_free(port):  # taken while Kafka and the engine started (one of theirs, even)
        stop_started()
        fail(f"port {port} is taken by another process: choose another with --port")
    argv = [dagster, "dev", "-h", "127.0.0.1", "-p", str(port), "-m", "riverhouse.definitions"]
    raise typer.Exit(run_until_signalled(argv, env, keep=keep, finally_=stop_started))


def main() -> None:
    # The Spark Connect client warns before it raises when an engine stops answering; the run's
    # own error (naming `riverhouse engine start`) says it better.
    warnings.filterwarnings("ignore", message=r".*RETRIES_EXCEEDED.*", category=UserWarning)
    skip_final_collection()
    app()


# Sub-commands in modules of their own; registered last, they use the helpers above.
from riverhouse.cli_engine import engine_app  # noqa: E402
from riverhouse.cli_kafka import kafka_app  # noqa: E402
from riverhouse.cli_migrate import deploy_config, import_app  # noqa: E402
from riverhouse.cli_registry import registry_app  # noqa: E402

app.add_typer(kafka_app, name="kafka")
app.add_typer(engine_app, name="engine")
app.add_typer(registry_app, name="registry")
app.add_typer(import_app, name="import")
app.command("deploy-config")(deploy_config)


if __name__ == "__main__":
    main()
