"""jvm_profile (`--profile`): a warm riverhouse_dedup run with Java Flight Recorder on the engine's JVM.

The recording is started and dumped with the JDK's `jcmd <pid> JFR.start|JFR.dump|JFR.stop` on
the JVM that runs the engine: the bench's in-process Spark driver (local mode: driver and
executors are that one JVM) or, with RIVERHOUSE_SPARK_REMOTE, a Spark Connect server on this
machine. Attaching to a running JVM records exactly the measured run, after the warm-up, the
same way for both. Beside it: the JVM's threads' CPU from /proc and Spark's event log of the
same run. `jfr.py` turns them into CPU seconds and microseconds per event by kind of work;
`profile-<time>.json` and `.md` go next to the bench's results, the recording stays in the
bench's home (it is large; `jfr summary`, `jfr print` or JDK Mission Control read it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from riverhouse_bench import jfr
from riverhouse_bench.metering import _process_tree, pid_listening_on

if TYPE_CHECKING:
    from riverhouse_bench.harness import Bench

RECORDING = "riverhouse-bench"
# Only the events jfr.py reads: CPU samples every 10 ms, GC pauses, compilations over 100 ms.
SETTINGS = """<?xml version="1.0" encoding="UTF-8"?>
<configuration version="2.0" label="riverhouse-bench" description="CPU samples, GC pauses, long compilations">
  <event name="jdk.ExecutionSample"><setting name="enabled">true</setting><setting name="period">10 ms</setting></event>
  <event name="jdk.GarbageCollection"><setting name="enabled">true</setting><setting name="threshold">0 ms</setting></event>
  <event name="jdk.Compilation"><setting name="enabled">true</setting><setting name="threshold">100 ms</setting></event>
</configuration>
"""
STACK_DEPTH = 64  # frames per sample: deep enough to reach the code that called a library


def jdk_tool(name: str) -> str:
    """A JDK tool (jcmd, jfr) next to the `java` Spark uses; a clear error when only a JRE is installed."""
    java_home = os.environ.get("JAVA_HOME")
    candidates = [Path(java_home) / "bin" / name] if java_home else []
    java = shutil.which("java")
    if java:
        candidates.append(Path(os.path.realpath(java)).parent / name)
    found = shutil.which(name)
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    raise RuntimeError(
        f"--profile needs the JDK's `{name}` (Debian/Ubuntu: openjdk-17-jdk-headless), next to the java "
        "Spark runs on (JAVA_HOME)"
    )


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def engine_jvm_pid() -> int:
    """The JVM that runs the engine's work: the Spark Connect server RIVERHOUSE_SPARK_REMOTE names (on
    this machine: jcmd attaches to local JVMs only), or else this process's Spark driver."""
    remote = os.environ.get("RIVERHOUSE_SPARK_REMOTE")
    if remote:
        # Found by the port it listens on: `riverhouse engine status` knows the pid of its own
        # home's engine only, and RIVERHOUSE_SPARK_REMOTE may name any engine on this machine.
        parts = urlsplit(remote)
        pid = pid_listening_on(parts.port or 15002) if parts.hostname in ("localhost", "127.0.0.1", "::1") else None
        if pid is None or "java" not in _cmdline(pid).split(" ", 1)[0]:
            raise RuntimeError(
                f"--profile: no JVM of this user listens at {remote} on this machine (jcmd attaches to local "
                "JVMs only): profile where the engine runs, or unset RIVERHOUSE_SPARK_REMOTE"
            )
        return pid
    drivers = [pid for pid in _process_tree() if "org.apache.spark.deploy.SparkSubmit" in _cmdline(pid)]
    if not drivers:
        raise RuntimeError("--profile: this process has no Spark driver JVM (the session was not started)")
    return drivers[0]


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """{thread id: (thread name, CPU seconds so far)} of every thread of `pid`, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            comm = (task / "comm").read_text().strip()
        except OSError:
            continue  # the thread ended while it was read
        out[int(task.name)] = (comm, (int(fields[11]) + int(fields[12])) / ticks)
    return out


class ThreadSampler:
    """Reads the JVM's threads' CPU every `interval_s`, so threads that end in between still count."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.first: dict[int, tuple[str, float]] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> None:
        self.last.update(thread_cpu(self.pid))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def __enter__(self) -> ThreadSampler:
        self.first = thread_cpu(self.pid)
        self.last = dict(self.first)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()


def jit_cpu_s() -> float | None:
    """CPU seconds the engine's JVM has spent in its JIT compiler threads so far (/proc), or None
    when that JVM is not on this machine. Read around each warm run: how far from settled the JIT
    still is when the run is measured (bench/analysis.md)."""
    try:
        threads = thread_cpu(engine_jvm_pid())
    except (RuntimeError, OSError):
        return None
    return sum(seconds for comm, seconds in threads.values() if jfr.thread_group(comm) == "jit")


def jit_used(before: float | None) -> float | None:
    """The engine JVM's JIT compiler threads' CPU seconds since `before` (None: not measurable here)."""
    after = jit_cpu_s()
    return None if before is None or after is None else round(max(0.0, after - before), 3)


def jcmd(pid: int, *args: str) -> str:
    ran = subprocess.run([jdk_tool("jcmd"), str(pid), *args], capture_output=True, text=True, timeout=120)
    text = (ran.stdout + ran.stderr).strip()
    if ran.returncode != 0 or "Exception" in text or "Could not" in text:
        raise RuntimeError(f"jcmd {pid} {' '.join(args)} failed: {text[-500:]}")
    return text


def read_recording(path: Path, began: float, ended: float) -> dict[str, Any]:
    """The recording's samples, GC pauses and long compilations between two epoch times, summarized.

    Read by JfrStacks.java (the JDK's own reader), streamed: a recording can be large.
    """
    window = [str(int(began * 1000)), str(int(ended * 1000))]
    command = [jdk_tool("java"), str(Path(__file__).with_name("JfrStacks.java")), str(path), str(STACK_DEPTH), *window]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as reader:
        assert reader.stdout is not None and reader.stderr is not None
        summary = jfr.summarize(reader.stdout)
        errors = reader.stderr.read()
    if reader.returncode != 0:
        raise RuntimeError(f"reading the JFR recording {path} failed: {errors.strip()[-500:]}")
    return summary


def recorder_conf(work: Path) -> dict[str, str]:
    """Spark settings that start the recorder with the driver's JVM (in-process sessions).

    `spark.driver.defaultJavaOptions` comes before the product's own extraJavaOptions, which
    it leaves alone. A recording started later with `jcmd JFR.start` made the recorded run's
    JVM use about twice the CPU (JIT threads and Java threads alike) in a warm dedup run on 2
    cores, and the next run without it went back; started with the JVM, the runs' CPU stayed
    as without a recorder. Only the last 30 minutes are kept; the profile reads its run's window.
    """
    work.mkdir(parents=True, exist_ok=True)
    settings = work / "riverhouse-bench.jfc"
    settings.write_text(SETTINGS)
    return {
        "spark.driver.defaultJavaOptions": f"-XX:StartFlightRecording=name={RECORDING},settings={settings},maxage=30m"
    }


def recording_running(pid: int) -> bool:
    """Whether the JVM already records under the bench's name (started with it: recorder_conf)."""
    return f"name={RECORDING}" in jcmd(pid, "JFR.check")


def profile_dedup(bench: Bench) -> dict[str, Any]:
    """A warm dedup run of `--events` orders on a fresh topic with JFR on, summarized by kind of work."""
    from riverhouse_bench.pipelines import _dedup_run

    cfg = bench.cfg
    if not bench.spark_started:  # a first run in a new JVM is not warm: run one unrecorded
        stats = bench.produce_orders("bench_profile_warmup", cfg.events, seed=31)
        _dedup_run(bench, "bench_profile_warmup", "bench_profile_warmup", stats.messages, stats.unique)
    pid = engine_jvm_pid()
    work = bench.home / "profile"
    work.mkdir(parents=True, exist_ok=True)
    recording = work / f"dedup-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.jfr"
    from_start = recording_running(pid)
    control: dict[str, Any] = {}
    if not from_start:
        # A JVM the bench did not start (a Spark Connect server) without the recorder: it starts
        # now, and the same run without it, right before, shows what that costs. An engine can
        # record from its start: RIVERHOUSE_SPARK_CONF='{"spark.driver.defaultJavaOptions":
        # "-XX:StartFlightRecording=name=riverhouse-bench,settings=<a .jfc>,maxage=30m"}' for
        # `riverhouse engine start` (see recorder_conf).
        stats = bench.produce_orders("bench_profile_control", cfg.events, seed=33)
        with ThreadSampler(pid) as control_threads:
            before = _dedup_run(bench, "bench_profile_control", "bench_profile_control", stats.messages, stats.unique)
        control = {
            "seconds": before["seconds"],
            "exact": before["exact"],
            "jvm_threads_cpu_s": jfr.cpu_by_thread_group(control_threads.first, control_threads.last),
            "stage_seconds": before["stage_seconds"],
        }
        settings = work / "riverhouse-bench.jfc"
        settings.write_text(SETTINGS)
        jcmd(pid, "JFR.start", f"name={RECORDING}", f"settings={settings}")
    stats = bench.produce_orders("bench_profile", cfg.events, seed=32)
    try:
        began = time.time()
        with ThreadSampler(pid) as sampler:
            run = _dedup_run(bench, "bench_profile", "bench_profile", stats.messages, stats.unique)
        ended = time.time()
        jcmd(pid, "JFR.dump", f"name={RECORDING}", f"filename={recording}")
    finally:
        if not from_start:
            jcmd(pid, "JFR.stop", f"name={RECORDING}")
    threads = jfr.cpu_by_thread_group(sampler.first, sampler.last)
    read = read_recording(recording, began, ended)
    sampled = read["samples"]
    events = run["events"]
    task_cpu = sum(row["cpu_s"] for row in run["spark_stages"].values())
    summary = {
        "events": events,
        "seconds": run["seconds"],
        "events_per_s": events / run["seconds"],
        "exact": run["exact"],
        "jvm_pid": pid,
        "engine": os.environ.get("RIVERHOUSE_SPARK_REMOTE") or "in-process Spark driver",
        "recording": str(recording),
        "recording_bytes": recording.stat().st_size,
        "jvm_threads_cpu_s": threads,
        "attribution": jfr.attribute(threads, sampled["by_bucket"], events),
        "samples": sampled,
        "gc": read["gc"],
        "compilation": read["compilation"],
        # Spark's event log of the same run: what its tasks used, against the whole JVM.
        "spark_task_cpu_s": round(task_cpu, 3),
        "spark_stages": run["spark_stages"],
        "stage_seconds": run["stage_seconds"],
        "cpu": run["cpu"],
        "recorder": "with the JVM" if from_start else "by jcmd JFR.start",
        "control": control,
    }
    stamp = recording.stem.removeprefix("dedup-")
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    (cfg.results_dir / f"profile-{stamp}.json").write_text(json.dumps(summary, indent=2, default=str))
    (cfg.results_dir / f"profile-{stamp}.md").write_text("\n".join(profile_markdown(summary)) + "\n")
    summary["written"] = [f"profile-{stamp}.json", f"profile-{stamp}.md"]
    return summary


def profile_markdown(p: dict[str, Any], brief: bool = False) -> list[str]:
    """The profile as a page: where the JVM's CPU went by kind of work, then (unless `brief`) the evidence."""
    a = p["attribution"]
    events = p["events"]
    lines = [
        "## Where the JVM's microseconds per event go (jvm_profile)",
        "",
        f"A warm riverhouse_dedup run of {events:,} events ({p['seconds']:.1f} s from the query's start to every "
        f"row in ClickHouse, exact: {p['exact']}) with Java "
        f"Flight Recorder on the engine's JVM ({p['engine']}; recorder started {p.get('recorder', '?')}). The JVM used {a['jvm_cpu_s']:.1f} CPU s, "
        f"{a['us_per_event'] or 0:.1f} us per event; Spark's tasks used {p['spark_task_cpu_s']:.1f} s of it "
        "(its event log). JIT compiler, GC and VM threads are measured from /proc; the Java threads' CPU is "
        f"shared out by {p['samples']['samples']:,} JFR execution samples (10 ms), each put in one bucket by "
        "its stack.",
        "",
        "| bucket | CPU s | share | us/event |",
        "|---|---:|---:|---:|",
    ]
    for bucket, row in a["buckets"].items():
        lines.append(f"| {bucket} | {row['cpu_s']:.2f} | {row['share']:.0%} | {row['us_per_event'] or 0:.1f} |")
    lines += ["", "JVM threads' CPU seconds by group (/proc): " + _pairs(p["jvm_threads_cpu_s"], "{:.2f} s") + "."]
    control = p.get("control") or {}
    if control.get("jvm_threads_cpu_s"):
        used = control["jvm_threads_cpu_s"]
        lines += [
            "",
            f"The same run without JFR, right before ({control['seconds']:.1f} s, a fresh topic of as many events): "
            f"{sum(used.values()):.1f} JVM CPU s, " + _pairs(used, "{:.2f} s") + ". The recording's cost is the "
            "difference; where it is large, read the buckets' shares rather than their seconds.",
        ]
    kinds = p["samples"]["by_thread_kind"]
    lines += ["", "Execution samples by thread: " + _pairs(kinds, "{:,}") + "."]
    if p["gc"]:
        gc = "; ".join(
            f"{name}: {row['collections']:,} collections, {row['pause_s']:.2f} s of pauses (longest "
            f"{row['longest_pause_s'] * 1000:.0f} ms)"
            for name, row in p["gc"].items()
        )
        lines += ["", f"Garbage collections (jdk.GarbageCollection): {gc}."]
    comp = p["compilation"]
    lines += [
        "",
        f"JIT compilations over 100 ms (jdk.Compilation): {comp['compilations_over_threshold']:,}, "
        f"{comp['seconds']:.2f} s.",
    ]
    if brief:
        return [*lines, "", f"Top frames and the frames behind each bucket: {', '.join(p.get('written') or [])}."]
    lines += [
        "",
        "Top frames (the method running when sampled):",
        "",
        "| frame | samples |",
        "|---|---:|",
        *[f"| `{frame}` | {count:,} |" for frame, count in p["samples"]["top_frames"]],
        "",
        "The frames that decided each bucket (the first recognized frame from the top of the stack):",
        "",
        "| bucket | frame | samples |",
        "|---|---|---:|",
    ]
    for bucket, frames in p["samples"]["deciding_frames"].items():
        lines += [f"| {bucket} | `{frame}` | {count:,} |" for frame, count in frames]
    return lines


def _pairs(values: dict[str, Any], spec: str) -> str:
    return ", ".join(f"{name} {spec.format(value)}" for name, value in values.items())
