"""Measurements of built variants: verification (GPU, Triton interpreter, CPU simulator), benchmarks, tuning,
Inductor capture."""
