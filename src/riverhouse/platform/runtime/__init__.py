"""Runtime: the Spark session, the pinned JVM jars it loads, and the Prometheus metrics."""
