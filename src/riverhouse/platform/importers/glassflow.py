"""`riverhouse import glassflow`: a GlassFlow pipeline config (v2 or v3) as a Riverhouse spec.

Both versions are first read into one neutral form (sources with their dedup,
filters and transforms; an optional join; the sink), keeping the path of every
setting as the user wrote it, then mapped to a spec. Whatever has no Riverhouse
equivalent is recorded with its path and the reason.

Fields keep GlassFlow's names as JSON paths: `user.id` is the spec field `user_id` with
`path: user.id`. In a pipeline without a join, a field loaded into one column is named after
that column (`{name: email, path: user.email}`), so renamed columns need no SQL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from riverhouse.platform.fields import parse_path
from riverhouse.platform.importers import glassflow_models as gf
from riverhouse.platform.importers.avro_source import avro_settings
from riverhouse.platform.importers.expr import FieldRef, Untranslatable, translate_expr
from riverhouse.platform.importers.glassflow_kafka import kafka_block
from riverhouse.platform.importers.glassflow_read import (
    UNKNOWN_KEY,
    Column,
    Pipeline,
    Source,
    detect_version,
    from_v2,
    from_v3,
    read_config,
    unknown_settings,
    validate_config,
)
from riverhouse.platform.importers.glassflow_types import spec_type
from riverhouse.platform.importers.report import (
    ImporterError,
    ImportResult,
    identifier,
    parse_go_duration,
    spec_window,
)
from riverhouse.platform.spec_base import IDENTIFIER_RE, SYSTEM_COLUMN_PREFIX
from riverhouse.platform.types import clickhouse_type, parse_type

SPARK_CASTS = {"string": "STRING", "int": "BIGINT", "int64": "BIGINT", "int32": "INT", "uint": "BIGINT"}
SPARK_CASTS |= {"float": "DOUBLE", "float64": "DOUBLE", "float32": "FLOAT", "bool": "BOOLEAN"}


@dataclass
class Decl:
    """A GlassFlow field as a spec field."""

    name: str
    type: str
    path: str | None  # the GlassFlow name, when it is not the column name
    allow_json_text: bool = False
    epoch_unit: str | None = None  # a number GlassFlow reads as a time

    def spec(self) -> Any:
        if self.path is None and not self.allow_json_text and self.epoch_unit is None:
            return self.type
        block: dict[str, Any] = {"type": self.type}
        if self.path is not None:
            block["path"] = self.path
        if self.allow_json_text:
            block["allow_json_text"] = True
        if self.epoch_unit is not None:
            block["epoch_unit"] = self.epoch_unit
        return block

    @property
    def scalar(self) -> bool:
        return not parse_type(self.type).is_container


# ---------------------------------------------------------------------------- mapping
def import_glassflow(path: str | Path, output: str | Path | None = None) -> ImportResult:
    """The spec for the config at `path`; `output` is where it will be written (None: printed), which
    places the certificate files `kafka.security` names beside it (in `result.files`)."""
    path = Path(path)
    data = read_config(path)
    version = detect_version(data, str(path))
    result = ImportResult({}, f"GlassFlow pipeline config {version}", str(path))
    if str(data.get("version") or version).lower() != version:
        result.note(f"version {data.get('version')!r}: read as {version} (its layout)")
    model = gf.PipelineV3 if version == "v3" else gf.PipelineV2
    config = validate_config(model, data, str(path))
    for setting in unknown_settings(config):
        result.drop(setting, UNKNOWN_KEY)
    pipeline = from_v3(config, result) if version == "v3" else from_v2(config, result)
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
    result.spec = spec  # filled from here on; its name names the secrets (source_block)
    if p.join is not None and p.sink_source:
        result.note(f"sink.source_id {p.sink_source!r}: the sink loads the join's output")
    if p.join is None and len(p.sources) > 1 and p.sink_source:
        chosen = [s for s in p.sources if s.sid == p.sink_source]
        for s in p.sources:
            if chosen and s is not chosen[0]:
                result.drop(
                    s.path, f"not loaded: the sink loads {p.sink_source!r} (sink.source_id) and there is no join"
                )
        p.sources = chosen or p.sources
    spec["kafka"] = kafka_block(p, result, output, spec["name"])
    names = {s.sid: identifier(s.sid, "source", result) for s in p.sources}
    for c in p.columns:
        c.column = output_column(c, result)
    dotted = next((f for s in p.sources for f in s.fields if "." in f), None)
    if dotted is not None:
        head, _, rest = dotted.partition(".")
        result.note(
            f"fields with dots in their names ({dotted}) are read as nested paths ({{'{head}': {{'{rest}': ...}}}}); "
            f"GlassFlow first tries a top-level key literally named '{dotted}': if your records have such keys, "
            f"write the path as a list (path: [{dotted}])"
        )
    if p.join is None:
        if len(p.sources) != 1:
            hint = (
                "join.enabled is false, though join describes the streams: set it to true to import the join"
                if p.join_disabled
                else "a GlassFlow pipeline without a join reads one topic (v2: sink.source_id names it)"
            )
            raise ImporterError(result.path, [("sources", f"{len(p.sources)} Kafka sources and no join", hint)])
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


def output_column(column: Column, result: ImportResult) -> str:
    """A sink column's name as a spec column (an identifier not starting with '_'), noting any change."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", column.column).lstrip(SYSTEM_COLUMN_PREFIX) or "column"
    name = name if name[0].isalpha() else f"c_{name}"
    name = name[:63]
    if name != column.column:
        result.note(f"{column.path}: column {column.column} is named {name} (spec columns are SQL identifiers)")
    return name


def column_name(gf_name: str, taken: set[str], preferred: str | None) -> str:
    """The spec column for a GlassFlow field: `preferred` (its sink column) when usable, else from its name."""
    candidates = [preferred] if preferred else []
    candidates.append(re.sub(r"[^A-Za-z0-9_]", "_", gf_name.replace(".", "_")).lstrip(SYSTEM_COLUMN_PREFIX) or "field")
    for base in candidates:
        base = base if base[0].isalpha() else f"f_{base}"
        if not IDENTIFIER_RE.fullmatch(base) or base.startswith(SYSTEM_COLUMN_PREFIX):
            continue
        name, n = base, 2
        while name.lower() in taken:
            name, n = f"{base}_{n}", n + 1
        return name
    return f"field_{len(taken) + 1}"


def declare(
    src: Source, wanted: dict[str, str | None], result: ImportResult, preferred: dict[str, str] | None = None
) -> dict[str, Decl]:
    """Spec fields for the GlassFlow fields `wanted` (name -> target ClickHouse type or None) that map.

    A wanted field that cannot map is reported; `preferred` names a field's column.
    """
    out: dict[str, Decl] = {}
    taken: set[str] = set()
    for gf_name, column_type in wanted.items():
        if gf_name not in src.fields or gf_name in out:
            continue
        gf_type, where = src.fields[gf_name]
        mapped = spec_type(gf_type, column_type, avro=src.registry is not None)
        if mapped is None:
            into = f" into a {column_type} column" if column_type else " (and no sink column says its element type)"
            result.drop(where, f"{gf_name!r} has type {gf_type}{into}: no spec type holds it")
            continue
        typ, json_text, note, epoch_unit = mapped
        name = column_name(gf_name, taken, (preferred or {}).get(gf_name))
        if name != gf_name:
            try:
                parse_path(gf_name)  # the GlassFlow name becomes the field's path
            except ValueError as exc:
                result.drop(where, str(exc))
                continue
        taken.add(name.lower())
        if note:
            result.note(f"{where}: {gf_name!r} {note}")
        out[gf_name] = Decl(name, typ, None if name == gf_name else gf_name, json_text, epoch_unit)
    return out


def declare_all(src: Source, wanted: dict[str, str | None], result: ImportResult, **kw: Any) -> dict[str, Decl]:
    """`wanted` plus every other field that maps (filters and transforms may use them); an unused field
    that cannot map is no loss and only noted."""
    unused = [f for f in src.fields if f not in wanted]
    extra = {f: None for f in unused if spec_type(src.fields[f][0], None) is not None}
    for f in unused:
        if f not in extra:
            result.note(f"{src.fields[f][1]}: {f!r} ({src.fields[f][0]}) is not used downstream and not declared")
    return declare(src, {**wanted, **extra}, result, **kw)


def source_block(src: Source, decls: dict[str, Decl], key: str, result: ImportResult) -> dict[str, Any]:
    block: dict[str, Any] = {"topic": src.topic, "fields": {d.name: d.spec() for d in decls.values()}}
    if src.registry is not None:
        registry, where = src.registry
        pipeline = str(result.spec.get("name") or "pipeline")
        block |= avro_settings(pipeline, registry.url, block["fields"], where, result, registry.api_key is not None)
    block["key"] = [decls[key].name]
    if src.dedup is not None:
        window = spec_window(src.dedup[1], f"{src.dedup[2]}.time_window", result)
        if window is not None:
            block["dedup"] = {"key": [decls[src.dedup[0]].name], "window": window}
    return block


def check_column_type(column: Column, typ: str, result: ImportResult) -> None:
    made = clickhouse_type(typ)
    if column.column_type.replace(" ", "") != made.replace(" ", ""):
        result.note(f"{column.path}: column {column.column} is created as {made} (GlassFlow: {column.column_type})")


def refs(src: Source, decls: dict[str, Decl]) -> dict[str, FieldRef]:
    """GlassFlow field names -> spec columns, for translating expressions."""
    return {gf_name: FieldRef(d.name, d.type, d.epoch_unit) for gf_name, d in decls.items()}


def record_key(
    src: Source,
    mapped: list[str],
    result: ImportResult,
    which: str = "the first mapped field that is not an array or map",
) -> str:
    """The dedup key, else the first of `mapped` (then of the schema) that can be a key (a scalar), named in a note."""
    if src.dedup is not None:
        if src.dedup[0] not in src.fields:
            raise ImporterError(
                result.path,
                [(src.dedup[2], f"dedup key {src.dedup[0]!r} is not declared in the source's schema", "declare it")],
            )
        return src.dedup[0]
    for gf_name in [*mapped, *(f for f in src.fields if f not in mapped)]:
        found = spec_type(src.fields[gf_name][0], None) if gf_name in src.fields else None
        if found is not None and not parse_type(found.type).is_container:
            if gf_name not in mapped:
                which = "no mapped field can be a key: the first field of the schema that is not an array or map"
            result.note(
                f"{src.path}: no dedup; {gf_name!r} ({which}) becomes the record key: records without it go to "
                "quarantine"
            )
            return gf_name
    raise ImporterError(
        result.path,
        [(src.path, "no field can be the record key", "map a string or number field, or add a dedup transform")],
    )


def projections(
    select: list[tuple[Column, Source, str]],
    decls: dict[str, dict[str, Decl]],
    names: dict[str, str],
    result: ImportResult,
) -> dict[str, str]:
    """Output column -> Spark SQL: a field (`orders.amount`) or a translated stateless transform."""
    exprs: dict[str, str] = {}
    for col, src, ref in select:
        if ref in src.fields:
            if ref in decls[src.sid]:
                exprs[col.column] = f"{names[src.sid]}.{decls[src.sid][ref].name}"
                check_column_type(col, decls[src.sid][ref].type, result)
            else:
                result.drop(col.path, f"field {ref!r} could not be imported (see above)")
            continue
        out, path = src.stateless[ref]
        try:
            sql = translate_expr(out.expression, names[src.sid], refs(src, decls[src.sid]))
        except Untranslatable as exc:
            result.drop(path, f"expression {out.expression!r}: {exc}")
            continue
        output_type = out.output_type.lower()
        if sql.field is not None and output_type in ("map", "array"):
            exprs[col.column] = sql.text  # a map or array field as it is
        elif output_type in SPARK_CASTS:
            exprs[col.column] = f"CAST({sql.text} AS {SPARK_CASTS[output_type]})"
        else:
            result.drop(path, f"output_type {out.output_type} of an expression: write the column yourself in query:")
    if not exprs:
        raise ImporterError(result.path, [("sink", "no sink column could be imported", "")])
    return exprs


def where_clauses(src: Source, decls: dict[str, Decl], name: str, result: ImportResult) -> list[str]:
    where = []
    for expression, path, keep in src.filters:
        try:
            sql = translate_expr(expression, name, refs(src, decls)).text
        except Untranslatable as exc:
            result.drop(path, f"filter {expression!r}: {exc}; write it in query: WHERE")
            continue
        where.append(sql if keep else f"NOT {sql}")
    return where


def select_sql(exprs: dict[str, str], source: str, join: str = "", where: list[str] | None = None) -> str:
    query = "SELECT " + ",\n       ".join(f"{e} AS {c}" for c, e in exprs.items()) + f"\nFROM {source}" + join
    return query + ("\nWHERE " + " AND ".join(where) if where else "") + "\n"


def single_source(
    p: Pipeline, src: Source, names: dict[str, str], result: ImportResult
) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """A dedup pipeline; a join-less `query:` when filters or transforms need a SELECT."""
    select: list[tuple[Column, Source, str]] = []
    for col in p.columns:
        if col.ref in src.fields or col.ref in src.stateless:
            select.append((col, src, col.ref))
        else:
            result.drop(col.path, f"{col.ref!r} is not a field of source {src.sid!r}'s schema")
    mapped = {ref: col.column_type for col, _, ref in select if ref in src.fields}
    key = record_key(src, list(mapped), result)
    # A field loaded into one column takes the column's name (and reads its GlassFlow name as the path).
    uses = [ref for _, _, ref in select if ref in src.fields]
    preferred = {col.ref: col.column for col, _, ref in select if ref in src.fields and uses.count(ref) == 1}
    needs_sql = bool(src.filters or src.stateless)
    wanted: dict[str, str | None] = {key: None, **mapped}
    decls = (declare_all if needs_sql else declare)(src, wanted, result, preferred=preferred)
    if key not in decls:
        raise ImporterError(result.path, [(src.path, f"key field {key!r} cannot be imported (see above)", "")])
    needs_sql = needs_sql or any(ref in decls and decls[ref].name != col.column for col, _, ref in select)
    name = names[src.sid]
    sources = {name: source_block(src, decls, key, result)}
    table = identifier(p.sink.table, "sink.table", result)
    if not needs_sql:
        if key not in mapped:
            result.note(f"{src.path}: key {key!r} is not a mapped column, but a dedup pipeline loads it too")
        for col, _, ref in select:
            if ref in decls:
                check_column_type(col, decls[ref].type, result)
        if not decls[key].scalar:
            raise ImporterError(result.path, [(src.path, f"key {key!r} is an array or map", "")])
        result.note(
            f"sink.order_by [{decls[key].name}]: Riverhouse creates the table if missing (GlassFlow needs it to exist)"
        )
        return sources, {"table": table, "order_by": [decls[key].name]}, None
    exprs = projections(select, {src.sid: decls}, names, result)
    order_col = next((c for c, e in exprs.items() if e == f"{name}.{decls[key].name}"), next(iter(exprs)))
    result.note(
        "query: a SELECT over one source (for its filter or transforms): rows pass through the gold table and are "
        "written when the stream's watermark reaches them (`riverhouse run --drain`: all now)"
    )
    return (
        sources,
        {"table": table, "order_by": [order_col]},
        select_sql(exprs, name, where=where_clauses(src, decls, name, result)),
    )


def joined(p: Pipeline, names: dict[str, str], result: ImportResult) -> tuple[Any, ...]:
    join = p.join
    assert join is not None
    by_id = {s.sid: s for s in p.sources}
    for side in (join.left, join.right):
        if side.sid not in by_id:
            raise ImporterError(result.path, [(f"{side.path}.source_id", f"{side.sid!r} is not a Kafka source", "")])
        if side.key not in by_id[side.sid].fields:
            raise ImporterError(
                result.path,
                [(side.path, f"join key {side.key!r} is not declared in {side.sid!r}'s schema", "declare the field")],
            )
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
                result.drop(col.path, f"{ref!r} is not one of the join's output fields")
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
    keys = {
        s.sid: record_key(s, [join.left.key if s is left else join.right.key], result, "its join key")
        for s in (left, right)
    }
    wanted: dict[str, dict[str, str | None]] = {
        left.sid: {join.left.key: None, keys[left.sid]: None},
        right.sid: {join.right.key: None, keys[right.sid]: None},
    }
    for col, src, ref in select:
        if ref in src.fields:
            wanted[src.sid][ref] = col.column_type
    decls = {s.sid: declare_all(s, wanted[s.sid], result) for s in (left, right)}
    for side in (join.left, join.right):
        decl = decls[side.sid].get(side.key)
        if decl is None or not decl.scalar:
            raise ImporterError(result.path, [(side.path, f"join key {side.key!r} cannot be imported as a key", "")])
    sources = {names[s.sid]: source_block(s, decls[s.sid], keys[s.sid], result) for s in (left, right)}

    # Expressions (filters, transforms) need the SQL form; otherwise the readable `join:` block.
    outputs = projections(select, decls, names, result)
    where = where_clauses(left, decls[left.sid], names[left.sid], result)
    for _, path, _ in right.filters:
        result.drop(path, "a filter on the right stream: WHERE would drop left rows; filter at the producer")
    left_key_col = f"{names[left.sid]}.{decls[left.sid][keys[left.sid]].name}"
    order_col = next((c for c, e in outputs.items() if e == left_key_col), next(iter(outputs)))
    result.note(
        "join: GlassFlow's docs call the left stream complete, yet its join service drops left events that find no "
        "match; Riverhouse makes it a LEFT join (unmatched left events emitted once their window closes). "
        "Set join.type: inner to keep only matches"
    )
    sink = {"table": identifier(p.sink.table, "sink.table", result), "order_by": [order_col]}
    lname, rname = names[left.sid], names[right.sid]
    lkey, rkey = decls[left.sid][join.left.key].name, decls[right.sid][join.right.key].name
    if not where and all(re.fullmatch(r"\w+\.\w+", e) for e in outputs.values()):
        on = {"left": [lkey], "right": [rkey]}
        block = {"type": "left", "left": lname, "right": rname, "on": on, "window": window, "select": outputs}
        return sources, block, None, None, sink
    on_sql = f"\nLEFT JOIN {rname} ON {lname}.{lkey} = {rname}.{rkey}"
    return sources, None, select_sql(outputs, lname, on_sql, where), {"ttl": window}, sink


def sink_settings(p: Pipeline, spec: dict[str, Any], result: ImportResult) -> None:
    sink = p.sink
    if sink.max_batch_size is not None:
        if 0 < sink.max_batch_size <= 10_000_000:
            spec["sink"]["batch_size"] = sink.max_batch_size
        elif sink.max_batch_size != 0:
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
