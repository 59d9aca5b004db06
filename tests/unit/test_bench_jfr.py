"""jvm_profile's reading of a JFR recording: buckets by stack, thread groups, CPU per event."""

from __future__ import annotations

from pathlib import Path

import pytest

from riverhouse_bench import jfr
from riverhouse_bench.metering import listening_inodes

pytestmark = pytest.mark.unit

# Stacks as the profile of a warm dedup run recorded them (top frame first, shortened).
FROM_JSON = [
    "com.fasterxml.jackson.core.json.UTF8StreamJsonParser.nextToken",
    "org.apache.spark.sql.catalyst.json.JacksonParser.parse",
    "org.apache.spark.sql.catalyst.expressions.JsonToStructs.nullSafeEval",
    "org.apache.spark.sql.catalyst.expressions.GeneratedClass$GeneratedIteratorForCodegenStage1.processNext",
    "org.apache.spark.executor.Executor$TaskRunner.run",
]
DELTA_LOG_JSON = [
    "com.fasterxml.jackson.core.json.UTF8StreamJsonParser.nextToken",
    "org.apache.spark.sql.catalyst.json.JacksonParser.parse",
    "org.apache.spark.sql.execution.datasources.json.JsonFileFormat.readFile",
    "org.apache.spark.executor.Executor$TaskRunner.run",
]
DELTA_COMMIT = [
    "com.fasterxml.jackson.core.JsonGenerator.writeString",
    "org.apache.spark.sql.delta.util.JsonUtils$.toJson",
    "org.apache.spark.sql.delta.OptimisticTransactionImpl.commit",
]
CODE_CACHE_LOOKUP = [
    "java.util.regex.Pattern$Node.match",
    "java.util.regex.Matcher.replaceAll",
    "scala.util.matching.Regex.replaceAllIn",
    "org.apache.spark.sql.catalyst.expressions.codegen.CodeFormatter$.stripExtraNewLinesAndComments",
    "org.apache.spark.sql.catalyst.expressions.codegen.GenerateUnsafeProjection$.create",
    "org.apache.spark.sql.execution.ProjectExec.doExecute",
]
KAFKA_LZ4 = [
    "net.jpountz.lz4.LZ4JNISafeDecompressor.decompress",
    "org.apache.kafka.common.compress.Lz4BlockInputStream.read",
    "org.apache.spark.sql.kafka010.KafkaDataConsumer.get",
]
PARQUET_SNAPPY = [
    "org.xerial.snappy.Snappy.compress",
    "org.apache.parquet.hadoop.CodecFactory$HeapBytesCompressor.compress",
    "org.apache.spark.sql.execution.datasources.FileFormatWriter.executeTask",
]


@pytest.mark.parametrize(
    ("frames", "bucket"),
    [
        (FROM_JSON, jfr.JSON_PARSE),
        (DELTA_LOG_JSON, jfr.DELTA),  # Spark's JSON file reader: Delta reading its log
        (DELTA_COMMIT, jfr.DELTA),  # Jackson writing a commit is Delta's, not the data's JSON
        (CODE_CACHE_LOOKUP, jfr.CODEGEN),
        (KAFKA_LZ4, jfr.KAFKA),  # compression belongs to whoever called it
        (PARQUET_SNAPPY, jfr.PARQUET),
        (["org.codehaus.janino.Parser.parse", "org.apache.spark.sql.delta.Snapshot.stateDS"], jfr.CODEGEN),
        (["py4j.GatewayConnection.run"], jfr.RPC),
        # Building code text is code generation; running the generated class is a row operator.
        (["org.apache.spark.sql.catalyst.expressions.codegen.Block.toString", "java.lang.Thread.run"], jfr.CODEGEN),
        (
            [
                "org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter.write",
                "org.apache.spark.sql.catalyst.expressions.GeneratedClass$SpecificUnsafeProjection.apply",
            ],
            jfr.OPERATORS,
        ),
        (["java.lang.Object.wait", "java.lang.Thread.run"], jfr.OTHER),
        ([], jfr.OTHER),
    ],
)
def test_a_stack_goes_to_the_bucket_of_its_first_recognized_frame(frames: list[str], bucket: str) -> None:
    assert jfr.classify(frames)[0] == bucket


def test_the_frame_that_decided_is_reported() -> None:
    assert jfr.classify(FROM_JSON) == (jfr.JSON_PARSE, "org.apache.spark.sql.catalyst.json.JacksonParser.parse")


def test_threads_by_name() -> None:
    assert jfr.thread_kind("Executor task launch worker for task 3.0 in stage 7.0 (TID 41)") == "executor tasks"
    assert jfr.thread_kind("Executor task idle worker#197") == "executor tasks"
    assert jfr.thread_kind("stream execution thread for x [id = 1, runId = 2]") == "streaming query driver"
    assert [
        jfr.thread_group(n) for n in ("C2 CompilerThre", "GC Thread#1", "G1 Conc#0", "VM Thread", "JFR Recorder Th")
    ] == [
        "jit",
        "gc",
        "gc",
        "vm",
        "jfr",
    ]
    assert jfr.thread_group("Executor task l") == "java"


def test_cpu_by_thread_group_counts_new_and_ended_threads() -> None:
    before = {1: ("C2 CompilerThre", 10.0), 2: ("Executor task l", 5.0), 3: ("GC Thread#0", 1.0)}
    # Thread 4 started in between: it counts from zero.
    after = {1: ("C2 CompilerThre", 14.5), 2: ("Executor task l", 7.0), 3: ("GC Thread#0", 1.5), 4: ("Thread-9", 0.75)}
    assert jfr.cpu_by_thread_group(before, after) == {"gc": 0.5, "java": 2.75, "jit": 4.5}


def test_summarize_reads_samples_gc_and_compilations() -> None:
    lines = [
        "S\tExecutor task idle worker#1\t" + ";".join(FROM_JSON) + "\n",
        "S\tExecutor task idle worker#1\t" + ";".join(FROM_JSON) + "\n",
        "S\tstream execution thread for q\t" + ";".join(DELTA_COMMIT) + "\n",
        "S\tThread-4\t\n",  # a sample without a stack
        "G\tG1New\t250000000\t200000000\n",
        "G\tG1New\t50000000\t50000000\n",
        "C\t150000000\n",
    ]
    out = jfr.summarize(lines)
    assert out["samples"]["samples"] == 4
    assert out["samples"]["by_bucket"] == {jfr.JSON_PARSE: 2, jfr.DELTA: 1, jfr.OTHER: 1}
    assert out["samples"]["by_thread_kind"]["executor tasks"] == 2
    assert out["samples"]["top_frames"][0] == (FROM_JSON[0], 2)
    assert out["gc"] == {"G1New": {"collections": 2, "pause_s": 0.3, "longest_pause_s": 0.2}}
    assert out["compilation"] == {"compilations_over_threshold": 1, "seconds": 0.15}


def test_attribute_shares_the_java_threads_by_samples_and_adds_jit_gc_vm() -> None:
    threads = {"java": 8.0, "jit": 2.0, "gc": 1.0, "vm": 0.5, "jfr": 0.5}
    out = jfr.attribute(threads, {jfr.JSON_PARSE: 30, jfr.CODEGEN: 10, jfr.OTHER: 40}, events=100_000)
    b = out["buckets"]
    assert b[jfr.JSON_PARSE]["cpu_s"] == 3.0
    assert b[jfr.CODEGEN]["cpu_s"] == 3.0  # 1.0 of samples + 2.0 of JIT threads
    assert b[jfr.GC]["cpu_s"] == 1.0 and b[jfr.PROFILER]["cpu_s"] == 0.5
    assert out["jvm_cpu_s"] == 12.0  # every CPU second of the JVM, once
    assert out["us_per_event"] == 120.0 and b[jfr.JSON_PARSE]["us_per_event"] == 30.0
    assert next(iter(b)) == jfr.OTHER  # largest first (4.0 s)


def test_listening_inodes_reads_the_kernels_tcp_table(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:3A9A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
        "   1: 0100007F:3A9A 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4343 1\n"
        "   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1\n"
    )
    assert listening_inodes(15002, (str(table),)) == {"4242"}  # 0x3A9A, listening; not the connection
    assert listening_inodes(8080, (str(table),)) == {"4444"}
    assert listening_inodes(1, (str(table), str(tmp_path / "missing"))) == set()


def test_the_profiles_page_names_the_buckets_per_event_and_the_recorders_cost() -> None:
    from riverhouse_bench.jvm_profile import profile_markdown

    threads = {"java": 8.0, "jit": 2.0, "gc": 1.0, "vm": 0.5, "jfr": 0.5}
    summary = {
        "events": 100_000,
        "seconds": 20.0,
        "exact": True,
        "engine": "in-process Spark driver",
        "spark_task_cpu_s": 5.0,
        "jvm_threads_cpu_s": threads,
        "attribution": jfr.attribute(threads, {jfr.JSON_PARSE: 30, jfr.CODEGEN: 10, jfr.OTHER: 40}, 100_000),
        "samples": jfr.summarize(["S\tExecutor task idle worker#1\t" + ";".join(FROM_JSON)])["samples"],
        "gc": {},
        "compilation": {"compilations_over_threshold": 0, "seconds": 0.0},
        "control": {"seconds": 18.0, "jvm_threads_cpu_s": {"java": 6.0, "jit": 1.5}},
        "written": ["profile-x.json", "profile-x.md"],
    }
    page = "\n".join(profile_markdown(summary, brief=True))
    assert "The JVM used 12.0 CPU s, 120.0 us per event" in page
    assert f"| {jfr.JSON_PARSE} | 3.00 | 25% | 30.0 |" in page
    assert "The same run without JFR, right before (18.0 s" in page and "7.5 JVM CPU s" in page
    assert "Top frames (the method running" not in page  # the full tables are in profile-x.md
