"""Benchmarks: `make bench` runs every bench/bench_*.py module; each prints `name: value unit` lines."""
