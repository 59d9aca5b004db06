"""Which sessions get Riverhouse's local file system (runtime/local_fs.py), and its jar on the class path."""

from __future__ import annotations

from pathlib import Path

import pytest

from riverhouse.platform.runtime import jars, local_fs
from riverhouse.platform.runtime.spark import session_conf

FS_KEYS = ("spark.hadoop.fs.file.impl", "spark.hadoop.fs.AbstractFileSystem.file.impl")


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A jars folder holding the built jar beside a pinned one (the files need not be real jars here)."""
    folder = tmp_path / "spark"
    folder.mkdir()
    for name in ("delta-spark_4.2_2.13-4.4.0.jar", local_fs.JAR_NAME):
        (folder / name).write_bytes(b"")
    monkeypatch.setenv("RIVERHOUSE_JARS", str(tmp_path))
    monkeypatch.delenv("RIVERHOUSE_SPARK_CONF", raising=False)
    return folder / local_fs.JAR_NAME


def test_local_sessions_get_the_file_system_and_its_jar_on_the_driver_class_path(built: Path) -> None:
    conf = session_conf("local[2]")
    assert [conf[k] for k in FS_KEYS] == ["riverhouse.hadoop.LocalFileSystem", "riverhouse.hadoop.LocalFs"]
    # spark-submit resolves `file:` before it loads spark.jars: the JVM's own class path must hold it.
    assert conf["spark.driver.extraClassPath"] == str(built)


def test_a_cluster_keeps_hadoops_classes(built: Path) -> None:
    conf = session_conf("spark://master:7077")
    assert not set(FS_KEYS) & set(conf)
    assert "spark.driver.extraClassPath" not in conf


def test_a_users_class_path_keeps_the_jar(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIVERHOUSE_SPARK_CONF", '{"spark.driver.extraClassPath": "/opt/extra/udfs.jar"}')
    conf = session_conf("local[2]")
    assert conf["spark.driver.extraClassPath"].split(":") == ["/opt/extra/udfs.jar", str(built)]


def test_a_users_own_file_system_is_left_alone(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "RIVERHOUSE_SPARK_CONF",
        '{"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem",'
        ' "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.LocalFs",'
        ' "spark.driver.extraClassPath": "/opt/extra/udfs.jar"}',
    )
    conf = session_conf("local[2]")
    assert conf["spark.hadoop.fs.file.impl"] == "org.apache.hadoop.fs.LocalFileSystem"
    assert conf["spark.driver.extraClassPath"] == "/opt/extra/udfs.jar"


def test_without_the_jar_nothing_changes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"")
    monkeypatch.setenv("RIVERHOUSE_JARS", str(tmp_path))
    monkeypatch.delenv("RIVERHOUSE_SPARK_CONF", raising=False)
    assert jars.spark_jar_files()
    conf = session_conf("local[2]")
    assert not set(FS_KEYS) & set(conf)
    assert "spark.driver.extraClassPath" not in conf


class _Context:
    """A running SparkContext's py4j view, as far as `loadable` uses it."""

    def __init__(self, loads: bool):
        def for_name(name: str) -> str:
            if not loads:
                raise RuntimeError(f"py4j.protocol.Py4JJavaError: java.lang.ClassNotFoundException: {name}")
            return name

        lang = type("Lang", (), {"Class": type("Class", (), {"forName": staticmethod(for_name)})})
        self._jvm = type("Jvm", (), {"java": type("Java", (), {"lang": lang})})


def test_a_context_started_elsewhere_without_the_jar_keeps_hadoops_classes(built: Path) -> None:
    conf = session_conf("local[2]")
    kept = local_fs.loadable(conf, _Context(loads=False))
    assert not set(FS_KEYS) & set(kept)
    assert kept["spark.sql.extensions"] == conf["spark.sql.extensions"]  # the rest untouched
    assert local_fs.loadable(conf, _Context(loads=True)) == conf
    assert local_fs.loadable(conf, None) == conf  # no context yet: this process starts the JVM
