"""The Dagster UI, driven in headless Chromium (Debian's chromium + Playwright's Python package).

`riverhouse ui` serves a pipeline on loopback. The test clicks "Materialize all" in the
asset graph, launches the run, waits for it on the run page, and reads the checks and the
metadata from the asset pages, as a person would. Then it sends garbage to Kafka and shows
that the failing blocking check is visible in the UI and stopped the ClickHouse load.
Screenshots go to test-output/e2e/.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.runtime import engine
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.state.settings import Settings
from tests.conftest import REPO, order, orders_spec, produce, riverhouse_cmd, subprocess_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = os.environ.get("RIVERHOUSE_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium keeps calling Google hosts this closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT = REPO / "test-output" / "e2e"
PIPELINE = "ui_orders"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ui(kafka: str, topic: str, settings: Settings, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`riverhouse ui` on a free loopback port, serving one pipeline that reads `topic`."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: `make test` installs Debian's chromium (apt-get install chromium)")
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    spec = orders_spec(topic, name=PIPELINE)
    data = spec.model_dump(mode="json", exclude_none=True)
    data["orchestration"]["sensor"]["enabled"] = False  # the test launches runs itself
    (pipelines / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(data))
    port = _free_port()
    proc = subprocess.Popen(
        [*riverhouse_cmd(), "ui", "--port", str(port), "--pipelines", str(pipelines)],
        env=subprocess_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=2):
                break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"riverhouse ui exited: {proc.stdout.read() if proc.stdout else ''}")
            time.sleep(1)
    else:
        pytest.fail("the Dagster UI did not come up within 120 s")
    if OUTPUT.exists():
        shutil.rmtree(OUTPUT)
    OUTPUT.mkdir(parents=True)
    try:
        yield {"url": url, "spec": spec, "port": port}
    finally:
        # `riverhouse ui` passes it to dagster dev, waits for its shutdown, then stops the engine
        # and the local Kafka it started; those stops below only act if it could not.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        engine.stop(settings.engine_state_dir)
        local_kafka.stop(settings.kafka_state_dir)  # the test used its own broker


@pytest.fixture
def page(ui: dict[str, Any]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(60_000)
        yield page
        browser.close()


def _launch_from_asset_graph(page: Any, url: str) -> str:
    """Materialize all -> Latest partition -> Launch 1 run; returns the run page URL."""
    page.goto(f"{url}/asset-groups/{PIPELINE}")
    page.get_by_role("button", name="Materialize all").wait_for()
    skip = page.get_by_role("button", name="Skip")  # Dagster's one-time newsletter prompt
    page.wait_for_timeout(2000)
    if skip.count():
        skip.click()
    page.get_by_role("button", name="Materialize all").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="Latest", exact=True).click()
    dialog.get_by_role("button", name="Launch 1 run").click()
    page.get_by_text("Launched run").wait_for()
    page.get_by_role("link", name="View").or_(page.get_by_role("button", name="View")).first.click()
    page.wait_for_url("**/runs/**")
    return page.url


def _wait_for_run(page: Any, ui: dict[str, Any], run_url: str, want: str, timeout_s: float = 300) -> None:
    """Wait (via the webserver's GraphQL API) for the run to end, then check the run page says so."""
    from dagster_graphql import DagsterGraphQLClient

    client = DagsterGraphQLClient("127.0.0.1", port_number=ui["port"])
    run_id = run_url.rstrip("/").split("/runs/")[1].split("?")[0]
    deadline = time.monotonic() + timeout_s
    status = None
    while time.monotonic() < deadline:
        status = client.get_run_status(run_id).value
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(2)
    assert status == {"Success": "SUCCESS", "Failure": "FAILURE"}[want], f"run {run_id} ended {status}"
    page.goto(run_url)
    page.locator("body").get_by_text(want, exact=True).first.wait_for()


def _asset_text(page: Any, url: str, path: str) -> str:
    page.goto(f"{url}/assets/{path}")
    page.get_by_text("Latest materialization").or_(page.get_by_text("Evaluation result")).first.wait_for()
    page.wait_for_timeout(2000)
    return page.locator("body").inner_text()


def test_materialize_from_the_asset_graph_then_see_a_blocking_check_fail(
    ui: dict[str, Any], page: Any, kafka: str, topic: str, settings: Settings
) -> None:
    url = ui["url"]
    events = [order(f"o{i}", "2026-01-01T10:00:00Z", amount=i + 1) for i in range(200)]
    produce(kafka, topic, events + events[:50])  # 50 producer retries

    run_url = _launch_from_asset_graph(page, url)
    _wait_for_run(page, ui, run_url, "Success")
    page.screenshot(path=str(OUTPUT / "01_run_succeeded.png"), full_page=True)

    bronze = _asset_text(page, url, f"bronze/{PIPELINE}/orders")
    page.screenshot(path=str(OUTPUT / "02_bronze_metadata.png"), full_page=True)
    for label, value in (("records_in", "250"), ("inserted", "200"), ("duplicates_dropped", "50")):
        line = next(ln for ln in bronze.splitlines() if ln.strip() == label)
        following = bronze.splitlines()[bronze.splitlines().index(line) :][:6]
        assert value in [x.strip().replace(",", "") for x in following], (label, following)

    checks = _asset_text(page, url, f"silver/{PIPELINE}/orders?view=checks")
    page.screenshot(path=str(OUTPUT / "03_silver_checks_passed.png"), full_page=True)
    assert "orders_passes_expectations" in checks and "orders_has_unique_keys_within_window" in checks
    assert "Failed" not in checks and "Succeeded" in checks

    sink = _asset_text(page, url, f"clickhouse/{PIPELINE}/{ui['spec'].sink.table}")
    assert "rows_loaded" in sink

    # Bad path: a run full of garbage trips the blocking rejected-rate check.
    produce(kafka, topic, [(b"x", b"not json")] * 40 + [order("late", "2026-01-01T11:00:00Z")])
    run_url = _launch_from_asset_graph(page, url)
    _wait_for_run(page, ui, run_url, "Failure")
    page.screenshot(path=str(OUTPUT / "04_run_failed.png"), full_page=True)
    checks = _asset_text(page, url, f"bronze/{PIPELINE}/orders?view=checks")
    page.screenshot(path=str(OUTPUT / "05_blocking_check_failed.png"), full_page=True)
    assert "orders_rejected_rate_is_below_0_05" in checks and "Failed" in checks
    # The check stopped the run before the load: ClickHouse still holds the first run's 200 orders.
    with open_client(settings.clickhouse_dsn) as client:
        loaded = client.query(f"SELECT count(), countIf(order_id = 'late') FROM {qualified_table(ui['spec'])}")
    assert loaded.result_rows[0] == (200, 0)
