"""runtime/jvm_build.py: Riverhouse's own classes compiled into their jars, or none without javac.

The Spark tests that use the jars skip when a jar is missing (a JRE-only machine); the first test
is what fails when a JDK is there and the build is broken (`make jars` goes on without the jars).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from riverhouse.platform.runtime import jvm_build
from riverhouse.platform.runtime.jars import jars_root

pytestmark = pytest.mark.unit


@pytest.mark.skipif(jvm_build._javac() is None, reason="no JDK's javac on this machine")
def test_make_jars_compiled_each_package_into_its_jar() -> None:
    """What `make jars` built into jvm/lib/spark (compiling here again would take ~15 s)."""
    folder = jars_root() / "spark"
    if not folder.is_dir():
        pytest.skip(f"no {folder}: `make jars` has not run")
    for jar, (package, _) in jvm_build.JARS.items():
        assert (folder / jar).exists(), f"{jar} missing though javac is here: see `make jars`' output"
        names = zipfile.ZipFile(folder / jar).namelist()
        sources = sorted((jvm_build.SOURCES / package).rglob("*.java"))
        assert sources
        for source in sources:  # every source's class, under its package's folder
            assert f"riverhouse/{package}/{source.stem}.class" in names, (jar, names)
        assert all(n.startswith(f"riverhouse/{package}/") for n in names)  # nothing of another package


def test_without_javac_nothing_is_built_and_the_reason_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "a-jre"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert jvm_build.build(tmp_path) == []
    assert list(tmp_path.glob("*.jar")) == []
    assert "no javac" in capsys.readouterr().err
