#!/bin/sh
# One image, several roles (docker/compose.yaml). Anything else runs as given (`riverhouse ...`).
set -eu
SPARK_HOME="$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
export SPARK_HOME SPARK_NO_DAEMONIZE=1
role="${1:-}"
case "$role" in
  spark-master)
    exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
      --host "$(hostname)" --port "${SPARK_MASTER_PORT:-7077}" --webui-port "${SPARK_MASTER_WEBUI_PORT:-8080}" ;;
  spark-worker)
    exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker "$SPARK_MASTER_URL" \
      --host "$(hostname)" --cores "${SPARK_WORKER_CORES:-2}" --memory "${SPARK_WORKER_MEMORY:-4g}" \
      --webui-port "${SPARK_WORKER_WEBUI_PORT:-8081}" ;;
  code-server)
    exec dagster code-server start -h 0.0.0.0 -p "$RIVERHOUSE_CODE_SERVER_PORT" -m riverhouse.definitions ;;
  webserver)
    exec dagster-webserver -h 0.0.0.0 -p "${DAGSTER_WEBSERVER_PORT:-3000}" -w "$DAGSTER_HOME/workspace.yaml" ;;
  daemon)
    exec dagster-daemon run -w "$DAGSTER_HOME/workspace.yaml" ;;
  *)
    exec "$@" ;;
esac
