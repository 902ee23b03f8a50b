"""Stand-ins for exo on real processes: workers, runners, MLX groups and launchers.

`selftest`, `make demo`, the tests and the benchmarks run them.
"""
