"""Quality: the data-quality predicates and Great Expectations suites behind the Dagster checks."""
