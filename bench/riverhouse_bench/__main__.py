"""`python -m riverhouse_bench ...` (bench/ on the path): what `make bench` runs."""

from riverhouse_bench.cli import main

main()
