"""The laboratory: lesson runner, diagnostics, parameter/FLOP accounting, benchmarks. Tools, not library."""
