"""check_java reads the version line, not the JVM's notice about JAVA_TOOL_OPTIONS.

A JVM started with JAVA_TOOL_OPTIONS set (corporate proxies, agents; the test run sets it)
prints "Picked up JAVA_TOOL_OPTIONS: ..." before its version: the check must still see a Java
that is too old.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from riverhouse.platform.runtime.spark import JavaMissingError, check_java

pytestmark = pytest.mark.unit


def fake_java_home(tmp_path: Path, version: str) -> Path:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(
        "#!/bin/sh\n"
        "echo 'Picked up JAVA_TOOL_OPTIONS: -XX:TieredStopAtLevel=1' >&2\n"
        f"echo 'openjdk version \"{version}\" 2020-01-14' >&2\n"
    )
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return home


def test_a_too_old_java_is_refused_behind_the_options_notice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(fake_java_home(tmp_path, "11.0.2")))
    with pytest.raises(JavaMissingError, match=r"11\.0\.2.*Java 17 or newer"):
        check_java()


def test_the_version_line_is_returned_behind_the_options_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(fake_java_home(tmp_path, "17.0.15")))
    assert check_java() == 'openjdk version "17.0.15" 2020-01-14'
