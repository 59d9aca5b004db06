"""docker/compose.yaml against the code: every variable Riverhouse reads is set where a driver runs,
addresses and ports agree between services, images are pinned, and the docs list every setting.

No Docker engine is needed; `docker compose config` runs where the compose CLI is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from riverhouse.deploy import DeployOptions, dagster_config, required_env, workspace_config
from riverhouse.platform.avro import local_registry

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
# The services whose processes run pipeline code: the code server's runs and the continuous
# service (Spark Connect clients), and the engine (Spark's driver: foreachBatch bodies run there).
DRIVERS = ("riverhouse-code", "riverhouse-stream", "spark-connect")
CLIENTS = ("riverhouse-code", "riverhouse-stream")
ENGINE = "spark-connect"
DAGSTER = ("riverhouse-code", "dagster-webserver", "dagster-daemon")
# Variables the code reads that a production deployment leaves unset, and why.
NOT_FOR_PRODUCTION = {
    "RIVERHOUSE_KAFKA_STATE": "the local development broker's folder; compose runs a real Kafka",
    "RIVERHOUSE_KAFKA_HEAP": "the local development broker's heap",
    "RIVERHOUSE_REGISTRY_HEAP": "the local schema registry's heap; compose's schema-registry sets -Xmx itself",
    "RIVERHOUSE_CRASH_AT": "fault injection for the crash tests",
    "RIVERHOUSE_CRASH_ON": "fault injection for the crash tests",
    "RIVERHOUSE_CRASH_KILL_PIDS": "fault injection for the crash tests (the engine's JVM)",
    "RIVERHOUSE_METRICS_PORT": "continuous mode only: set on riverhouse-stream, not on run workers",
    "RIVERHOUSE_METRICS_HOST": "continuous mode only: set on riverhouse-stream",
    "RIVERHOUSE_METRICS_LAG_INTERVAL": "has a default (15 s)",
    "RIVERHOUSE_SPARK_CONF": "optional extra Spark settings; the image's spark-defaults.conf holds the cluster's",
    "RIVERHOUSE_ENGINE_PID": "set by the engine itself for the Python workers it starts",
    "RIVERHOUSE_NO_CLASS_ARCHIVE": "turns the engine's class-data archive off; the image makes none",
}
# Per service: variables only another role reads.
EXCUSED = {
    "riverhouse-stream": {"RIVERHOUSE_METRICS_PUSHGATEWAY", "RIVERHOUSE_ENGINE_MEMORY"},  # serves its metrics
    "riverhouse-code": {"RIVERHOUSE_ENGINE_MEMORY"},  # the engine's own heap: set on the engine
    "spark-connect": set(),
}


def image_env() -> dict[str, str]:
    """ENV of the Riverhouse image's last stage: every container of the image starts with it."""
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    last_stage = text[text.rindex("\nFROM ") :]
    out: dict[str, str] = {}
    for line in last_stage.splitlines():
        if line.startswith("ENV "):
            out.update(dict(re.findall(r"([A-Z_]+)=(\S+)", line)))
    return out


def env(service: str) -> dict[str, str]:
    inherited = image_env() if SERVICES[service].get("image", "").startswith("riverhouse:") else {}
    return {**inherited, **{k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()}}


def variables_read_by_the_code() -> set[str]:
    """Every RIVERHOUSE_* name the package reads from the environment (literal or module constant)."""
    names: set[str] = set()
    for path in (REPO / "src" / "riverhouse").rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r"environ(?:\.get)?[\(\[]\s*\"(RIVERHOUSE_[A-Z_]+)\"", text))
        names |= set(re.findall(r"^[A-Z_]+_ENV\s*=\s*\"(RIVERHOUSE_[A-Z_]+)\"", text, re.M))
    return names


def test_every_variable_the_code_reads_is_set_where_pipelines_run_or_excused() -> None:
    read = variables_read_by_the_code()
    # The scan must see the settings module's variables, or it proves nothing.
    assert {"RIVERHOUSE_WAREHOUSE", "RIVERHOUSE_CLICKHOUSE_DSN", "RIVERHOUSE_METRICS_PUSHGATEWAY"} <= read
    needed = read - set(NOT_FOR_PRODUCTION)
    for service in DRIVERS:
        missing = needed - set(env(service)) - EXCUSED[service]
        assert not missing, f"{service} lacks {sorted(missing)}"
    set_anywhere = {name for s in SERVICES for name in env(s) if name.startswith("RIVERHOUSE_")}
    assert image_env()["RIVERHOUSE_JARS"] == "/opt/riverhouse/jvm/lib"  # where the image copies the jars
    referenced_by_dagster_files = set(required_env(DeployOptions()))
    unknown = set_anywhere - read - referenced_by_dagster_files
    assert not unknown, f"compose sets variables nothing reads (typos?): {sorted(unknown)}"


def test_dagster_processes_get_what_the_generated_instance_files_reference() -> None:
    referenced = set(re.findall(r"'env': '([A-Z_]+)'", str(dagster_config(DeployOptions()))))
    referenced |= set(re.findall(r"'env': '([A-Z_]+)'", str(workspace_config(DeployOptions()))))
    assert referenced == set(required_env(DeployOptions()))
    for service in DAGSTER:
        missing = referenced - set(env(service))
        assert not missing, f"{service} lacks {sorted(missing)}"
        assert env(service)["DAGSTER_HOME"] == "/opt/dagster/home"
    assert "riverhouse deploy-config --out /opt/dagster/home" in (DOCKER / "Dockerfile").read_text()


def hostport(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"x://{url}")
    return parts.hostname or "", parts.port or default_port


def test_addresses_and_ports_agree_between_services() -> None:
    code = env("riverhouse-code")
    kafka = env("kafka")
    assert hostport(code["RIVERHOUSE_KAFKA_BOOTSTRAP"], 0) == hostport(
        kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")[0], 0
    )
    assert ":" + str(hostport(code["RIVERHOUSE_KAFKA_BOOTSTRAP"], 0)[1]) in kafka["KAFKA_LISTENERS"]

    # The runs attach to the engine; the engine is the cluster's driver.
    engine = SERVICES[ENGINE]
    remote_host, remote_port = hostport(code["RIVERHOUSE_SPARK_REMOTE"], 0)
    assert code["RIVERHOUSE_SPARK_REMOTE"].startswith("sc://")
    assert remote_host == engine["hostname"]
    command = engine["command"]
    assert command[:4] == ["riverhouse", "engine", "start", "--foreground"]
    assert command[command.index("--port") + 1] == str(remote_port)
    assert command[command.index("--host") + 1] == "0.0.0.0"  # reachable from the other containers
    assert "ports" not in engine  # Spark Connect has no authentication without TLS: not published
    for client in CLIENTS:
        assert env(client)["RIVERHOUSE_SPARK_REMOTE"] == code["RIVERHOUSE_SPARK_REMOTE"]
        assert SERVICES[client]["depends_on"][ENGINE] == {"condition": "service_healthy"}
    assert env(ENGINE)["RIVERHOUSE_SPARK_MASTER"] == code["RIVERHOUSE_SPARK_MASTER"]
    # Spark writes the offsets on the engine, the runs lock and read them: one volume, one path.
    checkpoints = code["RIVERHOUSE_CHECKPOINTS"]
    assert env(ENGINE)["RIVERHOUSE_CHECKPOINTS"] == checkpoints
    for service in DRIVERS:
        mounts = {m.split(":")[1]: m.split(":")[0] for m in SERVICES[service]["volumes"]}
        holding = [path for path in mounts if checkpoints.startswith(path.rstrip("/") + "/")]
        assert holding and mounts[holding[0]] == "riverhouse-state", f"{service}: checkpoints not on the volume"

    master_host, master_port = hostport(code["RIVERHOUSE_SPARK_MASTER"], 0)
    assert master_host == SERVICES["spark-master"]["hostname"]
    assert env("spark-master")["SPARK_MASTER_PORT"] == str(master_port)
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert env(worker)["SPARK_MASTER_URL"] == code["RIVERHOUSE_SPARK_MASTER"]
        assert SERVICES[worker]["hostname"] == worker  # distinct hostnames: two workers, not one twice

    dsn = urlsplit(code["RIVERHOUSE_CLICKHOUSE_DSN"])
    clickhouse = env("clickhouse")
    assert (dsn.hostname, dsn.port) == (SERVICES["clickhouse"]["hostname"], 8123)
    assert (dsn.username, dsn.password) == (clickhouse["CLICKHOUSE_USER"], clickhouse["CLICKHOUSE_PASSWORD"])
    assert dsn.path.strip("/") == clickhouse["CLICKHOUSE_DB"]

    postgres = env("postgres")
    assert code["DAGSTER_POSTGRES_HOST"] == SERVICES["postgres"]["hostname"]
    assert code["DAGSTER_POSTGRES_PORT"] == "5432"
    assert code["DAGSTER_POSTGRES_USER"] == postgres["POSTGRES_USER"]
    assert code["DAGSTER_POSTGRES_PASSWORD"] == postgres["POSTGRES_PASSWORD"]
    assert code["DAGSTER_POSTGRES_DB"] == postgres["POSTGRES_DB"]

    assert code["RIVERHOUSE_CODE_SERVER_HOST"] == SERVICES["riverhouse-code"]["hostname"]
    entrypoint = (DOCKER / "entrypoint.sh").read_text()
    assert '-p "$RIVERHOUSE_CODE_SERVER_PORT"' in entrypoint  # the server listens where the others look

    storage = json.loads(code["RIVERHOUSE_STORAGE_OPTIONS"])
    minio = env("minio")
    assert hostport(storage["AWS_ENDPOINT_URL"], 0) == (SERVICES["minio"]["hostname"], 9000)
    assert storage["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
    assert storage["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]
    bucket = urlsplit(code["RIVERHOUSE_WAREHOUSE"]).hostname
    assert f"store/{bucket}" in " ".join(SERVICES["minio-bucket"]["command"])

    gateway = hostport(code["RIVERHOUSE_METRICS_PUSHGATEWAY"], 0)
    stream = env("riverhouse-stream")
    targets = [
        t
        for job in yaml.safe_load((DOCKER / "prometheus.yml").read_text())["scrape_configs"]
        for c in job["static_configs"]
        for t in c["targets"]
    ]
    assert f"{gateway[0]}:{gateway[1]}" in targets
    assert f"{SERVICES['riverhouse-stream']['hostname']}:{stream['RIVERHOUSE_METRICS_PORT']}" in targets
    assert stream["RIVERHOUSE_METRICS_HOST"] == "0.0.0.0"  # reachable from the Prometheus container


def test_the_schema_registry_runs_the_pinned_jar_where_make_puts_it_and_keeps_its_schemas() -> None:
    registry = SERVICES["schema-registry"]
    assert registry["image"].startswith("riverhouse:")  # the image's jars, fetched as `make jars` does
    command = registry["command"]
    assert command[0] == "java"
    flags = dict(a[2:].split("=", 1) for a in command if a.startswith("-D") and "=" in a)
    assert flags["quarkus.http.host"] == "0.0.0.0"  # reachable from the other containers
    assert flags["registry.rules.global.compatibility"] == "BACKWARD"  # as `riverhouse registry start` sets
    assert any(a.startswith("-Xmx") for a in command)
    # The runner jar of the version jvm/pom.xml pins, in the folder the image copies from `make`'s layout.
    version = re.search(r"<apicurio\.version>([^<]+)</apicurio\.version>", (REPO / "jvm" / "pom.xml").read_text())
    assert version, "jvm/pom.xml no longer pins apicurio.version: update this test"
    jar = Path(command[command.index("-jar") + 1])
    assert jar == Path(image_env()["RIVERHOUSE_JARS"]) / "registry" / f"apicurio-registry-app-{version[1]}-runner.jar"
    assert jar.match("apicurio-registry-app-*-runner.jar")  # what local_registry.runner_jar() looks for
    dockerfile = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    makefile = (REPO / "Makefile").read_text().replace("\\\n", " ")
    for text in (dockerfile, makefile):
        assert re.search(r"-P registry dependency:copy-dependencies", text)
        assert re.search(r"tar -xzf \S+/apicurio-registry-app-\*-all\.tar\.gz -C \S+/registry\s", text)
    assert "COPY --from=jars /src/jvm/lib ./jvm/lib" in dockerfile

    # Avro sources name it by its Confluent-compatible API; the README shows that URL.
    port = int(flags["quarkus.http.port"])
    url = f"http://{registry['hostname']}:{port}{local_registry.CCOMPAT}"
    assert url in (DOCKER / "README.md").read_text()
    assert "ports" not in registry  # no authentication: not published
    for service in DRIVERS:  # runs read the schemas at planning and per batch
        assert SERVICES[service]["depends_on"]["schema-registry"] == {"condition": "service_healthy"}
    health = " ".join(registry["healthcheck"]["test"])
    assert f"localhost:{port}/health/ready" in health
    assert '"/health/ready"' in Path(local_registry.__file__).read_text()  # the readiness the CLI waits on

    # Schemas in an H2 file on a named volume: the ids in Kafka's records must outlive the container.
    datasource = env("schema-registry")["REGISTRY_DATASOURCE_URL"]
    assert datasource.startswith("jdbc:h2:file:/")
    mounts = {m.split(":")[1]: m.split(":")[0] for m in registry["volumes"]}
    holding = [path for path in mounts if datasource.removeprefix("jdbc:h2:file:").startswith(path.rstrip("/") + "/")]
    assert holding and mounts[holding[0]] in COMPOSE["volumes"], "the registry's H2 file is not on a named volume"
    # A new named volume takes the owner of the image's folder: the image's user must own it.
    assert re.search(rf"chown -R riverhouse [^\n]*{re.escape(holding[0])}(\s|$)", dockerfile)


def test_images_are_pinned_and_the_riverhouse_image_matches_the_package() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name, service in SERVICES.items():
        image = service.get("image")
        assert image, f"{name} has no image"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d", tag), f"{name}: image {image} is not pinned"
        if repo == "riverhouse":
            assert tag == version, f"{name}: riverhouse:{tag}, but the package is {version}"
    built = [name for name, s in SERVICES.items() if "build" in s]
    assert len(built) == 1  # built once, reused by every other riverhouse service
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            image = line.split()[1]
            assert ":" in image and not image.endswith(":latest"), line
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "openjdk-17" in dockerfile
    # The jars come from the same Maven step as `make jars`, pruned the same way.
    makefile = (REPO / "Makefile").read_text()
    maven = re.search(r"\$\(MVN\) (-B.*?)-DoutputDirectory", makefile, re.S)
    assert maven, "the Makefile's Maven step moved: update this test"
    flags = {f for f in maven.group(1).replace("\\", " ").split() if not f.startswith("$")}
    assert {"-f", "jvm/pom.xml", "dependency:copy-dependencies"} <= flags
    assert flags <= set(dockerfile.replace("\\", " ").split()), sorted(flags)
    assert (
        "-m riverhouse.platform.runtime.jars prune" in makefile
        and "-m riverhouse.platform.runtime.jars prune" in dockerfile
    )


def test_the_deployment_page_lists_every_setting_compose_sets() -> None:
    page = (REPO / "docs" / "deployment.md").read_text()
    names = {n for s in SERVICES for n in env(s) if n.startswith(("RIVERHOUSE_", "DAGSTER_"))}
    names |= set(re.findall(r"\$\{([A-Z_]+):-", (DOCKER / "compose.yaml").read_text()))
    missing = sorted(n for n in names if f"`{n}`" not in page)
    assert not missing, f"docs/deployment.md does not list {missing}"


def compose_cli() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "the docker command is not installed"
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False)
    return None if probe.returncode == 0 else "the docker compose plugin is not installed"


def test_docker_compose_config_accepts_the_file() -> None:
    reason = compose_cli()
    if reason:
        pytest.skip(f"docker compose config not run: {reason}")
    proc = subprocess.run(
        ["docker", "compose", "-f", str(DOCKER / "compose.yaml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_image_compiles_riverhouse_s_json_classes_against_pyspark_s_jars() -> None:
    """jvm_build.py compiles riverhouse-json.jar at `make jars` against pyspark/jars; the image (a JRE
    at runtime) does it in the jars stage, against the same artifacts at the versions pyspark ships."""
    import pyspark

    from riverhouse.platform.runtime.jvm_build import JARS, JSON_JAR

    dockerfile = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    fetched = dict(re.findall(r"\b[\w.-]+:([\w.-]+):(\d[\w.]*)[\s;]", dockerfile))  # artifact -> version
    for pattern in JARS[JSON_JAR][1]:
        shipped = sorted((Path(pyspark.__file__).parent / "jars").glob(pattern))
        assert shipped, f"pyspark/jars has no {pattern}: jvm_build.py compiles against it"
        artifact = pattern.removesuffix("*.jar").removesuffix("-").removesuffix("_")
        name = shipped[-1].name.removesuffix(".jar")
        assert any(name == f"{a}-{v}" for a, v in fetched.items() if a.startswith(artifact)), (
            f"pyspark ships {name}.jar: fetch that version in the Dockerfile's jars stage ({fetched})"
        )
    assert "-cp '/tmp/api/*'" in dockerfile
    assert "COPY jvm/src/riverhouse/json jvm/src/riverhouse/json" in dockerfile
    assert f"--file /src/jvm/lib/spark/{JSON_JAR} " in dockerfile  # where spark_jar_files() looks
