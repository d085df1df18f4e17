"""latency_bench: motion-to-photon and load benchmarks (see its issue)."""
