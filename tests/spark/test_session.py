"""The SparkSession's Python workers import the installed pyspark, not Spark's zip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.runtime.spark import local_spark_home

pytestmark = pytest.mark.spark


def test_workers_import_pyspark_from_site_packages(spark: Any) -> None:
    """Python workers of the session (in-process, or beside the engine) import the installed pyspark."""
    import pyspark

    def _worker_imports(batches: Any) -> Any:  # defined here: pickled by value, the workers lack `tests`
        import pyarrow as pa
        import pyspark

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"file": [pyspark.__file__]})

    rows = spark.range(0, 2, numPartitions=2).mapInArrow(_worker_imports, "file string").collect()
    files = [r["file"] for r in rows]
    # The zip has no bytecode cache: importing from it recompiled pyspark in every worker.
    assert files and all(".zip" not in f for f in files), files
    assert {Path(f).resolve() for f in files} == {Path(pyspark.__file__).resolve()}


def test_overlay_links_everything_but_the_zip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    package = tmp_path / "pyspark"
    (package / "bin").mkdir(parents=True)
    (package / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (package / "jars").mkdir()
    lib = package / "python" / "lib"
    lib.mkdir(parents=True)
    (lib / "pyspark.zip").write_bytes(b"zip")
    (lib / "py4j-0.10.9.9-src.zip").write_bytes(b"py4j")

    home = local_spark_home(package, "4.3.0")
    assert home is not None and home.is_relative_to(tmp_path / "cache")
    assert (home / "bin" / "spark-submit").read_text() == "#!/bin/sh\n"
    assert (home / "jars").resolve() == (package / "jars").resolve()
    assert (home / "python" / "lib" / "py4j-0.10.9.9-src.zip").read_bytes() == b"py4j"
    assert not (home / "python" / "lib" / "pyspark.zip").exists()
    assert local_spark_home(package, "4.3.0") == home  # made once, then reused
    assert local_spark_home(package, "4.4.0") != home  # another pyspark, another folder

    (lib / "pyspark.zip").unlink()  # not a pip-installed pyspark: leave SPARK_HOME alone
    assert local_spark_home(package, "4.5.0") is None
