"""The benchmark modes, one module each (``python benchmarks/benchmark.py MODE``)."""
