"""latency_bench: the benchmarks (see its issue): motion-to-photon and load through the real transports
(`python -m worldcast.latency_bench`), the engine alone (`engine_bench.py`, `admission_bench.py`), and the
prepared device check for a lent GPU (`gpu_check/`)."""
