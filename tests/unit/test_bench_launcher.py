"""`riverhouse bench` outside a clone: a clear message, not an ImportError."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from riverhouse import cli

pytestmark = pytest.mark.unit


def test_bench_without_the_repositorys_bench_folder_says_where_the_benchmarks_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli, "bench_folder", lambda: None)  # as in a wheel install, run outside a clone
    result = CliRunner().invoke(cli.app, ["bench", "--events", "1000"])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "not part of the installed riverhouse package" in text and "make bench" in text, text
    assert "Traceback" not in result.output


def test_a_clone_is_found_from_the_source_checkout() -> None:
    folder = cli.bench_folder()
    assert folder is not None and (folder / "riverhouse_bench" / "__main__.py").is_file()
