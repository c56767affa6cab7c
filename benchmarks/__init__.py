"""fleetscope's benchmark suite: ``python3 benchmarks/run.py`` regenerates ``docs/benchmarks.md``."""
