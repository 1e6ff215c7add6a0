"""Engine micro-benchmarks (`make bench-engine`)."""
