"""Our engine package must never shadow the standard library's `platform`."""

import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def test_import_platform_is_the_standard_library() -> None:
    import platform

    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(platform.__file__).resolve().parent == stdlib
    assert callable(platform.python_version)


def test_engine_lives_under_riverhouse() -> None:
    import riverhouse.platform as engine

    assert Path(engine.__file__).parent.parent.name == "riverhouse"
