"""Reading a Java Flight Recorder recording: where a JVM's CPU went, by kind of work.

Pure functions over the recording's events as `JfrStacks.java` prints them (the JDK's own
reader, jdk.jfr.consumer; one event a line) and what /proc says of the JVM's threads, so they
can be tested without a JVM. Two sources are combined:

- /proc/<pid>/task/*: CPU seconds of every JVM thread. The JIT compiler threads, the GC
  threads and the VM's own threads are told apart by their names; what is left is the Java
  threads (Spark's tasks, its driver, py4j or Spark Connect's handlers).
- JFR's `jdk.ExecutionSample` events: the stack of a Java thread running Java code, every
  10 ms (jvm_profile.SETTINGS). Each sample is put in one bucket (below); the Java threads'
  CPU seconds are shared out in proportion to the samples.

So every CPU second of the JVM lands in exactly one bucket, and divided by the run's
events it says where the JVM's microseconds per event go. GC pauses and compilations come
from JFR's own `jdk.GarbageCollection` and `jdk.Compilation` events, beside the threads' CPU.
The rules below are prefixes of `package.Class.method`: widen them when the profile's
"frames that decided each bucket" show a bucket taking what is not its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

# Bucket names, in the order the summary lists them.
JSON_PARSE = "JSON parse (from_json, variant)"
PARQUET = "Parquet encode/decode (and compression)"
DELTA = "Delta log/commit (snapshots, log files, commits)"
CODEGEN = "codegen/JIT (Janino compiles, JIT compiler threads)"
GC = "GC (garbage collector threads)"
KAFKA = "Kafka fetch (consumer, record decode)"
SHUFFLE = "shuffle (exchange, network, serializer)"
RPC = "py4j/connect RPC (and Python runner)"
PLANNING = "query planning (analyzer, optimizer, planner)"
STREAMING = "streaming bookkeeping (offsets, commit log, triggers)"
OPERATORS = "row operators (generated code, aggregates, sort, cache)"
FILES = "file I/O (Hadoop file system, checksums)"
SCHEDULING = "scheduling, task (de)serialization, listeners"
ARROW = "Arrow (results to Python)"
VM = "JVM internals (VM thread, other service threads)"
PROFILER = "JFR itself (the recording's own threads)"
OTHER = "other"

# Whole-stack markers, checked first: work whose top frames look like another bucket's.
STACK_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (CODEGEN, ("org.codehaus.janino.", "org.codehaus.commons.compiler.")),
    # Spark's JSON file reader: in this engine only Delta reads JSON files (its _delta_log).
    (DELTA, ("org.apache.spark.sql.execution.datasources.json.",)),
)
# Frames that never decide (libraries used by every bucket: JSON, compression, collections):
# the classifier looks further down, to the code that called them.
TRANSPARENT = (
    "java.",
    "javax.",
    "jdk.",
    "sun.",
    "scala.",
    "com.fasterxml.jackson.",
    "com.google.",
    "org.slf4j.",
    "com.github.luben.zstd.",
    "org.xerial.snappy.",
    "io.airlift.compress.",
    "net.jpountz.",
    "org.apache.hadoop.io.compress.",
)
# "package.Class.method" prefixes; the first frame from the top that matches one decides.
FRAME_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        CODEGEN,
        (
            # Generating code, and cleaning it to look it up in the compiled-code cache (a regex pass).
            "org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator",
            "org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext",
            "org.apache.spark.sql.catalyst.expressions.codegen.CodeFormatter",
            "org.apache.spark.sql.catalyst.expressions.codegen.Block",
            "org.apache.spark.sql.catalyst.expressions.codegen.CodeBlock",
            "org.apache.spark.sql.catalyst.expressions.codegen.JavaCode",
            "org.apache.spark.sql.catalyst.expressions.codegen.Generate",
            "org.apache.spark.sql.catalyst.expressions.CodeGeneratorWithInterpretedFallback",
            "org.apache.spark.sql.execution.WholeStageCodegenExec.doCodeGen",
        ),
    ),
    (
        JSON_PARSE,
        (
            "org.apache.spark.sql.catalyst.json.",
            "org.apache.spark.sql.catalyst.expressions.JsonToStructs",
            "org.apache.spark.sql.catalyst.expressions.variant.",
            "org.apache.spark.types.variant.",
        ),
    ),
    (
        PARQUET,
        (
            "org.apache.parquet.",
            "shaded.parquet.",
            "org.apache.spark.sql.execution.datasources.parquet.",
        ),
    ),
    (KAFKA, ("org.apache.kafka.", "org.apache.spark.sql.kafka010.", "org.apache.spark.kafka010.")),
    (DELTA, ("io.delta.", "org.apache.spark.sql.delta.")),
    (ARROW, ("org.apache.arrow.", "org.apache.spark.sql.execution.arrow.", "org.apache.spark.sql.util.ArrowUtils")),
    (
        SHUFFLE,
        (
            "org.apache.spark.shuffle.",
            "org.apache.spark.network.",
            "io.netty.",
            "org.apache.spark.sql.execution.exchange.",
            "org.apache.spark.sql.execution.UnsafeRowSerializer",
            "org.apache.spark.io.",
        ),
    ),
    (
        RPC,
        (
            "py4j.",
            "org.apache.spark.sql.connect.",
            "org.sparkproject.connect.",
            "io.grpc.",
            "org.apache.spark.api.python.",
            "org.apache.spark.sql.execution.python.",
        ),
    ),
    (FILES, ("org.apache.hadoop.fs.", "org.apache.hadoop.util.", "org.apache.spark.sql.execution.datasources.")),
    (
        PLANNING,
        (
            "org.apache.spark.sql.catalyst.analysis.",
            "org.apache.spark.sql.catalyst.optimizer.",
            "org.apache.spark.sql.catalyst.rules.",
            "org.apache.spark.sql.catalyst.trees.",
            "org.apache.spark.sql.catalyst.plans.",
            "org.apache.spark.sql.catalyst.planning.",
            "org.apache.spark.sql.execution.SparkStrategies",
            "org.apache.spark.sql.execution.SparkPlanner",
            "org.apache.spark.sql.execution.QueryExecution",
            "org.apache.spark.sql.execution.adaptive.",
            "org.apache.spark.sql.execution.CacheManager",
        ),
    ),
    (STREAMING, ("org.apache.spark.sql.execution.streaming.", "org.apache.spark.sql.streaming.")),
    (
        OPERATORS,
        (
            "org.apache.spark.rdd.",
            "org.apache.spark.sql.catalyst.expressions.",
            "org.apache.spark.unsafe.",
            "org.apache.spark.sql.execution.",
            "org.apache.spark.util.collection.",
            "org.apache.spark.sql.catalyst.",
        ),
    ),
    (
        SCHEDULING,
        (
            "org.apache.spark.scheduler.",
            "org.apache.spark.executor.",
            "org.apache.spark.rpc.",
            "org.apache.spark.serializer.",
            "org.apache.spark.storage.",
            "org.apache.spark.status.",
            "org.apache.spark.util.JsonProtocol",
            "org.json4s.",
            "com.esotericsoftware.",
        ),
    ),
)
# JVM threads by name (Linux keeps 15 characters of it); the rest are Java threads.
THREAD_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("jit", ("C1 CompilerThre", "C2 CompilerThre", "Sweeper thread")),
    ("gc", ("GC Thread", "G1 ", "GC ", "ParGC", "Concurrent Mark")),
    ("vm", ("VM Thread", "VM Periodic", "Service Thread", "Monitor Deflati", "Signal Dispatch", "Attach Listener")),
    ("jfr", ("JFR ",)),
)


def classify(frames: list[str]) -> tuple[str, str]:
    """(bucket, the frame that decided it) for one stack, top frame first."""
    for bucket, prefixes in STACK_MARKERS:
        for frame in frames:
            if frame.startswith(prefixes):
                return bucket, frame
    for frame in frames:
        if frame.startswith(TRANSPARENT):
            continue
        for bucket, prefixes in FRAME_RULES:
            if frame.startswith(prefixes):
                return bucket, frame
    return OTHER, next((f for f in frames if not f.startswith(TRANSPARENT)), frames[0] if frames else "?")


def thread_kind(name: str) -> str:
    """What a sampled Java thread is, from its Java name: where Spark's work runs."""
    # Spark 4 names a pooled executor thread "Executor task idle worker#N" between tasks, and JFR
    # keeps the name it first saw: both are task threads.
    if name.startswith("Executor task"):
        return "executor tasks"
    if name.startswith("stream execution thread"):
        return "streaming query driver"
    if name.startswith("spark-listener-group"):
        return "listeners (event log, status)"
    if "SparkConnect" in name or name.startswith("grpc-"):
        return "Spark Connect handlers"
    if name.startswith("Thread-"):
        return "py4j (Python driver calls)"
    return "other driver threads"


def thread_group(comm: str) -> str:
    for group, prefixes in THREAD_GROUPS:
        if comm.startswith(prefixes):
            return group
    return "java"


def cpu_by_thread_group(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each thread group used between two readings of {tid: (name, CPU seconds)}.

    A thread that started in between counts from zero; one that ended counts up to its last reading.
    """
    used: dict[str, float] = {}
    for tid, (comm, seconds) in after.items():
        start = before.get(tid, (comm, 0.0))[1]
        group = thread_group(comm)
        used[group] = used.get(group, 0.0) + max(0.0, seconds - start)
    return {group: round(seconds, 3) for group, seconds in sorted(used.items())}


def summarize(lines: Iterable[str], top: int = 12) -> dict[str, Any]:
    """A recording as JfrStacks.java prints it -> samples by bucket and thread kind, top frames, GC, compilations.

    Lines: `S <thread> <frame;frame...>` (an execution sample, top frame first), `G <collector>
    <sum of pauses ns> <longest pause ns>`, `C <compilation ns>`.
    """
    buckets: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    deciding: dict[str, Counter[str]] = {}
    gc: dict[str, dict[str, float]] = {}
    compilations: list[float] = []
    for line in lines:
        kind, _, rest = line.rstrip("\n").partition("\t")
        if kind == "S":
            thread, _, stack = rest.partition("\t")
            frames = stack.split(";") if stack else []
            bucket, frame = classify(frames)
            buckets[bucket] += 1
            kinds[thread_kind(thread)] += 1
            leaves[frames[0] if frames else "?"] += 1
            deciding.setdefault(bucket, Counter())[frame] += 1
        elif kind == "G":
            name, pauses, longest = rest.split("\t")
            row = gc.setdefault(name, {"collections": 0, "pause_s": 0.0, "longest_pause_s": 0.0})
            row["collections"] += 1
            row["pause_s"] += int(pauses) / 1e9
            row["longest_pause_s"] = max(row["longest_pause_s"], int(longest) / 1e9)
        elif kind == "C":
            compilations.append(int(rest) / 1e9)
    return {
        "samples": {
            "samples": sum(buckets.values()),
            "by_bucket": dict(buckets.most_common()),
            "by_thread_kind": dict(kinds.most_common()),
            "top_frames": leaves.most_common(top),
            "deciding_frames": {bucket: counter.most_common(5) for bucket, counter in deciding.items()},
        },
        "gc": {name: {k: round(v, 4) for k, v in row.items()} for name, row in gc.items()},
        # JFR keeps the compilations over its threshold (100 ms with `profile`); wall time, not CPU.
        "compilation": {"compilations_over_threshold": len(compilations), "seconds": round(sum(compilations), 3)},
    }


def attribute(threads: dict[str, float], by_bucket: dict[str, int], events: int) -> dict[str, Any]:
    """The JVM's CPU seconds by bucket, and per event: Java threads shared out by their samples.

    `threads`: CPU seconds by thread group (cpu_by_thread_group); `by_bucket`: samples per bucket.
    """
    java = threads.get("java", 0.0)
    sampled = sum(by_bucket.values())
    seconds: dict[str, float] = {}
    for bucket, count in by_bucket.items():
        seconds[bucket] = java * count / sampled if sampled else 0.0
    if not sampled and java:
        seconds[OTHER] = java  # no samples (JFR off?): the Java threads' time is not attributed
    seconds[CODEGEN] = seconds.get(CODEGEN, 0.0) + threads.get("jit", 0.0)
    seconds[GC] = seconds.get(GC, 0.0) + threads.get("gc", 0.0)
    seconds[VM] = seconds.get(VM, 0.0) + threads.get("vm", 0.0)
    seconds[PROFILER] = seconds.get(PROFILER, 0.0) + threads.get("jfr", 0.0)
    total = sum(seconds.values())
    rows = {
        bucket: {
            "cpu_s": round(value, 3),
            "share": round(value / total, 4) if total else 0.0,
            "us_per_event": round(value * 1e6 / events, 2) if events else None,
        }
        for bucket, value in sorted(seconds.items(), key=lambda kv: -kv[1])
        if value > 0
    }
    return {
        "jvm_cpu_s": round(total, 3),
        "us_per_event": round(total * 1e6 / events, 2) if events else None,
        "buckets": rows,
    }
