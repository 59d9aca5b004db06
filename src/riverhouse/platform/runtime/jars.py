"""The pinned JVM jars (jvm/pom.xml): where `make` put them and how a Spark session gets them.

`make jars` copies each profile of jvm/pom.xml into a folder of its own under jvm/lib/:
`spark/` (Spark's Kafka connector, delta-spark and what they need beyond pyspark/jars) and
`broker/` (a single-node Apache Kafka broker). RIVERHOUSE_JARS points elsewhere (an image,
a shared folder). Without the folder, a Spark session falls back to `spark.jars.packages`
with the same coordinates read from the POM (Ivy, which needs network access to Maven
Central at session start).
"""

from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

_REPO = Path(__file__).resolve().parents[4]
POM = _REPO / "jvm" / "pom.xml"
_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
# "kafka-clients-3.9.2.jar" -> "kafka-clients"; "delta-spark_4.2_2.13-4.4.0.jar" -> "delta-spark_4.2_2.13"
_ARTIFACT_RE = re.compile(r"^(?P<name>.+?)-\d[^-]*(?:-[A-Za-z0-9.]+)?\.jar$")

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
# Riverhouse's own JSON classes (jvm/src/riverhouse/json, built by runtime/jvm_build.py) and the
# session extension among them that registers their SQL functions (ingest/parse.py,
# `has_json_functions`): `riverhouse_json_sure` and `riverhouse_from_json`.
JSON_JAR = "riverhouse-json.jar"
JSON_EXTENSION = "riverhouse.json.Extensions"


class JarsMissingError(RuntimeError):
    pass


def jars_root() -> Path:
    return Path(os.environ.get("RIVERHOUSE_JARS") or _REPO / "jvm" / "lib")


def _jars(profile: str) -> list[Path]:
    folder = jars_root() / profile
    return sorted(folder.glob("*.jar")) if folder.is_dir() else []


def _missing(what: str) -> JarsMissingError:
    return JarsMissingError(
        f"the {what} jars are not in {jars_root()}: run `make jars` in the Riverhouse checkout "
        "(needs Maven and Java 17+), or set RIVERHOUSE_JARS to a folder holding spark/, broker/ and registry/ "
        "made from jvm/pom.xml"
    )


def spark_jar_files() -> list[Path]:
    """The pinned Spark jars (Kafka connector, delta-spark, ...) of jvm/lib/spark; empty without `make jars`."""
    return _jars("spark")


def broker_classpath() -> str:
    """Class path of the Kafka broker, or a JarsMissingError saying how to get it."""
    jars = _jars("broker")
    if not any(j.name.startswith("kafka_") for j in jars):
        raise _missing("Kafka broker")
    return os.pathsep.join(str(j) for j in jars)


def pom_coordinates(profile: str = "spark", pom: Path = POM) -> list[str]:
    """group:artifact:version of a profile's direct dependencies, properties substituted."""
    root = ET.parse(pom).getroot()
    props = {el.tag.split("}")[1]: (el.text or "").strip() for el in root.find("m:properties", _NS) or []}

    def expand(text: str | None) -> str:
        return re.sub(r"\$\{([^}]+)\}", lambda m: props[m.group(1)], (text or "").strip())

    for prof in root.iterfind("m:profiles/m:profile", _NS):
        if prof.findtext("m:id", namespaces=_NS) == profile:
            return [
                ":".join(
                    expand(dep.findtext(f"m:{part}", namespaces=_NS)) for part in ("groupId", "artifactId", "version")
                )
                for dep in prof.iterfind("m:dependencies/m:dependency", _NS)
            ]
    raise KeyError(f"no profile {profile!r} in {pom}")


def pom_exclusions(profile: str = "spark", pom: Path = POM) -> list[str]:
    """group:artifact of every exclusion in a profile (hadoop-aws's 690 MB AWS SDK `bundle`)."""
    root = ET.parse(pom).getroot()
    for prof in root.iterfind("m:profiles/m:profile", _NS):
        if prof.findtext("m:id", namespaces=_NS) == profile:
            return sorted(
                {
                    f"{ex.findtext('m:groupId', namespaces=_NS)}:{ex.findtext('m:artifactId', namespaces=_NS)}"
                    for ex in prof.iterfind("m:dependencies/m:dependency/m:exclusions/m:exclusion", _NS)
                }
            )
    raise KeyError(f"no profile {profile!r} in {pom}")


def spark_conf() -> dict[str, str]:
    """What every Riverhouse SparkSession needs: the jars (local and on a cluster) and Delta.

    `spark.jars` lists local files; Spark's driver serves them to executors, so a
    standalone, YARN or Kubernetes cluster needs nothing installed beforehand.
    """
    jars = _jars("spark")
    if jars:
        conf = {"spark.jars": ",".join(str(j) for j in jars), **DELTA_CONF}
        if any(j.name == JSON_JAR for j in jars):
            conf["spark.sql.extensions"] = f"{DELTA_CONF['spark.sql.extensions']},{JSON_EXTENSION}"
        return conf
    if POM.exists():
        packages = {"spark.jars.packages": ",".join(pom_coordinates("spark"))}
        if excludes := pom_exclusions("spark"):  # Ivy would fetch what the POM excludes
            packages["spark.jars.excludes"] = ",".join(excludes)
        return {**packages, **DELTA_CONF}
    raise _missing("Spark (Kafka connector, delta-spark)")


def artifact_name(jar: str) -> str:
    match = _ARTIFACT_RE.match(jar)
    return match.group("name") if match else jar


def prune(folder: Path) -> list[str]:
    """Delete the jars pyspark/jars already ships (any version: Spark's own must win)."""
    import pyspark

    shipped = {artifact_name(j.name) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    removed = []
    for jar in sorted(Path(folder).glob("*.jar")):
        if artifact_name(jar.name) in shipped:
            jar.unlink()
            removed.append(jar.name)
    return removed


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "prune":
        gone = prune(Path(sys.argv[2]))
        kept = sorted(p.name for p in Path(sys.argv[2]).glob("*.jar"))
        print(f"    {len(kept)} Spark jars kept, {len(gone)} left to pyspark/jars")
    else:
        sys.exit("usage: python -m riverhouse.platform.runtime.jars prune FOLDER")
