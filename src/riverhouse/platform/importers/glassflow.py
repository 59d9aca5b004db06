"""`riverhouse import glassflow`: a GlassFlow pipeline config (v2 or v3) as a Riverhouse spec.

Both versions are first read into one neutral form (sources with their dedup,
filters and transforms; an optional join; the sink), keeping the path of every
setting as the user wrote it, then mapped to a spec. Whatever has no Riverhouse
equivalent is recorded with its path and the reason.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from riverhouse.platform.importers import glassflow_models as gf
from riverhouse.platform.importers.expr import translate_expr
from riverhouse.platform.importers.glassflow_kafka import kafka_block
from riverhouse.platform.importers.glassflow_read import (
    Column,
    Pipeline,
    Source,
    detect_version,
    from_v2,
    from_v3,
    read_config,
    validate_config,
)
from riverhouse.platform.importers.report import (
    ImporterError,
    ImportResult,
    identifier,
    parse_go_duration,
    spec_window,
)
from riverhouse.platform.sink.clickhouse import CLICKHOUSE_TYPES

SCALAR_TYPES = {
    "string": "string",
    "bytes": "string",
    "datetime": "timestamp",
    "bool": "boolean",
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "uint8": "int",
    "uint16": "int",
    "int": "long",
    "int64": "long",
    "uint": "long",
    "uint32": "long",
    "uint64": "long",
    "float": "double",
    "float64": "double",
    "float32": "float",
}
NUMERIC_COLUMNS = {"Int8": "int", "Int16": "int", "Int32": "int", "UInt8": "int", "UInt16": "int"}
NUMERIC_COLUMNS |= {"Int64": "long", "UInt32": "long", "UInt64": "long", "Float32": "float", "Float64": "double"}
SPARK_CASTS = {"string": "STRING", "int": "BIGINT", "int64": "BIGINT", "int32": "INT", "uint": "BIGINT"}
SPARK_CASTS |= {"float": "DOUBLE", "float64": "DOUBLE", "float32": "FLOAT", "bool": "BOOLEAN"}


# ---------------------------------------------------------------------------- mapping
def import_glassflow(path: str | Path, output: str | Path | None = None) -> ImportResult:
    """The spec for the config at `path`; `output` is where it will be written (None: printed), which
    places the certificate files `kafka.security` names beside it (in `result.files`)."""
    path = Path(path)
    data = read_config(path)
    version = detect_version(data, str(path))
    result = ImportResult({}, f"GlassFlow pipeline config {version}", str(path))
    if version == "v3":
        pipeline = from_v3(validate_config(gf.PipelineV3, data, str(path)), result)
    else:
        pipeline = from_v2(validate_config(gf.PipelineV2, data, str(path)), result)
    if not pipeline.sources:
        raise ImporterError(str(path), [("sources", "no Kafka source to import", "Riverhouse reads Kafka topics")])
    result.spec = build_spec(pipeline, result, None if output is None else Path(output))
    result.validate()
    return result


def build_spec(p: Pipeline, result: ImportResult, output: Path | None) -> dict[str, Any]:
    if str(p.sink.type).lower() != "clickhouse":
        raise ImporterError(result.path, [("sink.type", f"{p.sink.type!r}: Riverhouse loads ClickHouse", "")])
    spec: dict[str, Any] = {"name": identifier(p.pipeline_id.replace("-", "_"), "pipeline_id", result)}
    spec["description"] = f"{p.name or p.pipeline_id} (imported from GlassFlow pipeline {p.pipeline_id})"
    spec["kafka"] = kafka_block(p, result, output, spec["name"])
    names = {s.sid: identifier(s.sid, "source", result) for s in p.sources}
    if p.join is None:
        if len(p.sources) != 1:
            raise ImporterError(
                result.path,
                [
                    (
                        "sources",
                        f"{len(p.sources)} Kafka sources and no join",
                        "a GlassFlow pipeline without a join has one",
                    )
                ],
            )
        spec["sources"], sink, query = single_source(p, p.sources[0], names, result)
        if query is not None:
            spec["query"] = query
        spec["sink"] = sink
    else:
        spec["sources"], spec["join"], spec["query"], spec["state"], spec["sink"] = joined(p, names, result)
        for key in ("join", "query", "state"):
            if spec[key] is None:
                del spec[key]
    sink_settings(p, spec, result)
    return spec


def field_type(src: Source, name: str, column_type: str | None, result: ImportResult) -> str | None:
    """The spec type of a GlassFlow field, or None with the reason recorded."""
    gf_type, path = src.fields[name]
    if "." in name:
        result.drop(path, f"nested field {name!r} (dot notation): Riverhouse reads top-level JSON fields")
        return None
    if gf_type not in SCALAR_TYPES:
        result.drop(
            path, f"{name!r} has type {gf_type}: Riverhouse fields are scalars (strings, numbers, booleans, times)"
        )
        return None
    typ = SCALAR_TYPES[gf_type]
    base = re.sub(r"^LowCardinality\((.*)\)$", r"\1", column_type or "")
    if typ in ("int", "long", "float", "double") and base in NUMERIC_COLUMNS:
        typ = NUMERIC_COLUMNS[base]  # GlassFlow's `int`/`float` take their width from the column
    if gf_type == "string" and base.startswith("DateTime"):
        typ = "timestamp"  # GlassFlow parses ISO 8601 text into DateTime columns; so does `timestamp`
    elif gf_type == "string" and base in ("Date", "Date32"):
        typ = "date"
    elif gf_type != "string" and base.startswith("DateTime") and typ != "timestamp":
        result.note(f"{path}: {name!r} holds Unix seconds; Riverhouse loads it as a number, not a DateTime")
    if gf_type == "uint64":
        result.note(f"{path}: {name!r} is uint64; values above 2^63-1 go to quarantine (Riverhouse long is signed)")
    return typ


def declare_fields(src: Source, wanted: dict[str, str | None], result: ImportResult) -> dict[str, str]:
    """Spec fields for `wanted` (name -> target ClickHouse type or None) that exist and map."""
    out: dict[str, str] = {}
    for name, column_type in wanted.items():
        if name in src.fields and name not in out:
            typ = field_type(src, name, column_type, result)
            if typ is not None:
                out[name] = typ
    return out


def source_block(src: Source, fields: dict[str, str], key: str, result: ImportResult) -> dict[str, Any]:
    block: dict[str, Any] = {"topic": src.topic, "fields": fields, "key": [key]}
    if src.dedup is not None:
        window = spec_window(src.dedup[1], f"{src.dedup[2]}.time_window", result)
        if window is not None:
            block["dedup"] = {"key": [src.dedup[0]], "window": window}
    return block


def check_column_type(column: Column, typ: str, result: ImportResult) -> None:
    made = CLICKHOUSE_TYPES[typ]
    declared = column.column_type.replace(" ", "")
    if declared != made.replace(" ", ""):
        result.note(f"{column.path}: column {column.column} is created as {made} (GlassFlow: {column.column_type})")


def declare_all(src: Source, wanted: dict[str, str | None], result: ImportResult) -> dict[str, str]:
    """`wanted` plus every other scalar field (filters and transforms may use them); unused fields of
    other types are no loss and only noted, while wanted ones that cannot map are reported."""
    unused = [f for f in src.fields if f not in wanted]
    scalar = {f: None for f in unused if src.fields[f][0] in SCALAR_TYPES and "." not in f}
    for f in unused:
        if f not in scalar:
            result.note(f"{src.fields[f][1]}: {f!r} ({src.fields[f][0]}) is not used downstream and not declared")
    return declare_fields(src, {**scalar, **wanted}, result)


def projections(
    select: list[tuple[Column, Source, str]],
    fields: dict[str, dict[str, str]],
    names: dict[str, str],
    result: ImportResult,
) -> dict[str, str]:
    """Output column -> Spark SQL: a field (`orders.amount`) or a translated stateless transform."""
    exprs: dict[str, str] = {}
    for col, src, ref in select:
        if ref in src.fields:
            if ref in fields[src.sid]:
                exprs[col.column] = f"{names[src.sid]}.{ref}"
                check_column_type(col, fields[src.sid][ref], result)
            else:
                result.drop(col.path, f"field {ref!r} could not be imported (see above)")
            continue
        out, path = src.stateless[ref]
        sql = translate_expr(out.expression, names[src.sid], set(fields[src.sid]))
        cast = SPARK_CASTS.get(out.output_type.lower())
        if sql is None or cast is None:
            result.drop(path, f"expression {out.expression!r} has no Spark SQL translation here; write it in query:")
            continue
        exprs[col.column] = f"CAST(({sql}) AS {cast})"
    if not exprs:
        raise ImporterError(result.path, [("sink", "no sink column could be imported", "")])
    return exprs


def where_clauses(src: Source, fields: dict[str, str], name: str, result: ImportResult) -> list[str]:
    where = []
    for expression, path, keep in src.filters:
        sql = translate_expr(expression, name, set(fields))
        if sql is None:
            result.drop(path, f"filter {expression!r} has no Spark SQL translation here; write it in query: WHERE")
        else:
            where.append(f"({sql})" if keep else f"NOT ({sql})")
    return where


def select_sql(exprs: dict[str, str], source: str, join: str = "", where: list[str] | None = None) -> str:
    query = "SELECT " + ",\n       ".join(f"{e} AS {c}" for c, e in exprs.items()) + f"\nFROM {source}" + join
    return query + ("\nWHERE " + " AND ".join(where) if where else "") + "\n"


def single_source(
    p: Pipeline, src: Source, names: dict[str, str], result: ImportResult
) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """A dedup pipeline; a join-less `query:` when filters, transforms or renamed columns need a SELECT."""
    select: list[tuple[Column, Source, str]] = []
    for col in p.columns:
        if col.ref in src.fields or col.ref in src.stateless:
            select.append((col, src, col.ref))
        else:
            result.drop(col.path, f"{col.ref!r} is not a field of source {src.sid!r}'s schema")
    needs_sql = bool(src.filters or src.stateless) or any(col.column != ref for col, _, ref in select)
    mapped = {ref: col.column_type for col, _, ref in select if ref in src.fields}
    key = src.dedup[0] if src.dedup else next(iter(mapped), None)
    if key is None or key not in src.fields:
        raise ImporterError(
            result.path, [(src.path, "no field to use as the record key", "declare the source's fields")]
        )
    wanted: dict[str, str | None] = {key: None, **mapped}
    fields = declare_all(src, wanted, result) if needs_sql else declare_fields(src, wanted, result)
    if key not in fields:
        raise ImporterError(result.path, [(src.path, f"key field {key!r} cannot be imported", "")])
    if src.dedup is None:
        result.note(f"{src.path}: no dedup; {key!r} becomes the record key (records without it go to quarantine)")
    name = names[src.sid]
    sources = {name: source_block(src, fields, key, result)}
    table = identifier(p.sink.table, "sink.table", result)
    if not needs_sql:
        if key not in mapped:
            result.note(f"{src.path}: key {key!r} is not a mapped column, but a dedup pipeline loads it too")
        for col, _, ref in select:
            if ref in fields:
                check_column_type(col, fields[ref], result)
        result.note(f"sink.order_by [{key}]: Riverhouse creates the table if missing (GlassFlow needs it to exist)")
        return sources, {"table": table, "order_by": [key]}, None
    exprs = projections(select, {src.sid: fields}, names, result)
    order_col = next((c for c, e in exprs.items() if e == f"{name}.{key}"), next(iter(exprs)))
    result.note(
        "query: a SELECT over one source (for its filter, transforms or renamed columns): rows pass through the "
        "gold table and are written when the stream's watermark reaches them (`riverhouse run --drain`: all now)"
    )
    return (
        sources,
        {"table": table, "order_by": [order_col]},
        select_sql(exprs, name, where=where_clauses(src, fields, name, result)),
    )


def joined(p: Pipeline, names: dict[str, str], result: ImportResult) -> tuple[Any, ...]:
    join = p.join
    assert join is not None
    by_id = {s.sid: s for s in p.sources}
    for side in (join.left, join.right):
        if side.sid not in by_id:
            raise ImporterError(result.path, [(f"{side.path}.source_id", f"{side.sid!r} is not a Kafka source", "")])
    left, right = by_id[join.left.sid], by_id[join.right.sid]
    windows = {s.path: parse_go_duration(s.window, f"{s.path}.time_window") for s in (join.left, join.right)}
    longest = max((join.left, join.right), key=lambda s: windows[s.path])
    if windows[join.left.path] != windows[join.right.path]:
        shorter = join.right if longest is join.left else join.left
        result.drop(
            f"{shorter.path}.time_window",
            f"{shorter.window}: a Riverhouse join has one window (|t_right - t_left| <= window); "
            f"{longest.window} of {longest.path} is used",
        )
    window = spec_window(longest.window, f"{longest.path}.time_window", result)
    if window is None:
        raise ImporterError(result.path, [(f"{longest.path}.time_window", "the join window cannot be imported", "")])
    # Each output column: (column, source, field or transform output).
    select: list[tuple[Column, Source, str]] = []
    for col in p.columns:
        sid, ref = col.sid, col.ref
        if sid is None and join.outputs is not None:
            if ref not in join.outputs:
                result.drop(col.path, f"{ref!r} is not one of join.output_fields")
                continue
            sid, ref = join.outputs[ref]
        if sid is None:
            owners = [s.sid for s in (left, right) if ref in s.fields or ref in s.stateless]
            if len(owners) != 1:
                result.drop(col.path, f"{ref!r} is {'ambiguous' if owners else 'not a field of either source'}")
                continue
            sid = owners[0]
        if sid not in (left.sid, right.sid) or (ref not in by_id[sid].fields and ref not in by_id[sid].stateless):
            result.drop(col.path, f"{sid}.{ref} is not a field of the joined sources")
            continue
        select.append((col, by_id[sid], ref))
    keys = {s.sid: s.dedup[0] if s.dedup else (join.left.key if s is left else join.right.key) for s in (left, right)}
    wanted: dict[str, dict[str, str | None]] = {
        left.sid: {join.left.key: None, keys[left.sid]: None},
        right.sid: {join.right.key: None, keys[right.sid]: None},
    }
    for col, src, ref in select:
        if ref in src.fields:
            wanted[src.sid][ref] = col.column_type
    fields = {s.sid: declare_all(s, wanted[s.sid], result) for s in (left, right)}
    sources = {names[s.sid]: source_block(s, fields[s.sid], keys[s.sid], result) for s in (left, right)}

    # Expressions (filters, transforms) need the SQL form; otherwise the readable `join:` block.
    outputs = projections(select, fields, names, result)
    where = where_clauses(left, fields[left.sid], names[left.sid], result)
    for _, path, _ in right.filters:
        result.drop(path, "a filter on the right stream: WHERE would drop left rows; filter at the producer")
    order_col = next((c for c, e in outputs.items() if e == f"{names[left.sid]}.{keys[left.sid]}"), next(iter(outputs)))
    result.note(
        "join: GlassFlow's docs call the left stream complete, yet its join service drops left events that find no "
        "match; Riverhouse makes it a LEFT join (unmatched left events emitted once their window closes). "
        "Set join.type: inner to keep only matches"
    )
    sink = {"table": identifier(p.sink.table, "sink.table", result), "order_by": [order_col]}
    lname, rname = names[left.sid], names[right.sid]
    if not where and all(re.fullmatch(r"\w+\.\w+", e) for e in outputs.values()):
        on = {"left": [join.left.key], "right": [join.right.key]}
        block = {"type": "left", "left": lname, "right": rname, "on": on, "window": window, "select": outputs}
        return sources, block, None, None, sink
    on_sql = f"\nLEFT JOIN {rname} ON {lname}.{join.left.key} = {rname}.{join.right.key}"
    return sources, None, select_sql(outputs, lname, on_sql, where), {"ttl": window}, sink


def sink_settings(p: Pipeline, spec: dict[str, Any], result: ImportResult) -> None:
    sink = p.sink
    if sink.max_batch_size is not None:
        if 0 < sink.max_batch_size <= 10_000_000:
            spec["sink"]["batch_size"] = sink.max_batch_size
        else:
            result.drop("sink.max_batch_size", f"{sink.max_batch_size} is outside 1 .. 10,000,000")
    if sink.max_delay_time:
        interval = spec_window(sink.max_delay_time, "sink.max_delay_time", result)
        if interval is not None:
            spec["orchestration"] = {"trigger_interval": interval}
            result.note(
                "sink.max_delay_time -> orchestration.trigger_interval (continuous mode: one load per micro-batch)"
            )
    conn = p.sink_connection
    where = (
        "sink.connection_params"
        if isinstance(sink, gf.SinkV3) or (p.version == "v2" and sink.connection_params)
        else "sink"
    )
    if conn is not None:
        database = conn.database or "default"
        if database != "default":
            spec["sink"]["database"] = identifier(database, "sink database", result)
        scheme = "https" if conn.secure else "http"
        port = conn.http_port or ("8443" if conn.secure else "8123")
        # Not a drop: the connection moves to the environment (never into the spec, credentials included).
        result.note(
            f"{where}: the ClickHouse connection is a setting, not part of a spec: "
            f"export RIVERHOUSE_CLICKHOUSE_DSN={scheme}://<username>:<password>@{conn.host}:{port}/{database}"
        )
        if conn.skip_certificate_verification:
            result.drop(f"{where}.skip_certificate_verification", "Riverhouse always verifies ClickHouse's certificate")
