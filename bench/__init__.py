"""h3core's benchmarks, studies and trials: each module prints markdown tables (the machine, what was
compared, one run). Run them from the repository root as modules, e.g. `python -m bench.throughput.store`;
bench/README.md is the index, bench/RESULTS.md the recorded runs."""
