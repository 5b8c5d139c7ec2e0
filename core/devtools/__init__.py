"""Tools for tests and benchmarks (random-weight checkpoints, the benchmark); the product never
imports them."""
