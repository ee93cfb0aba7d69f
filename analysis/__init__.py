"""Everything that measures or models, knows the kernels, knows nothing about Quarto:

- `analysis.bench`: the benchmark (sweeps, timing, machine limits, workers, one grid
  module per family group, the tail steps); `python -m triton_fusion_report.analysis.bench --help`.
- `analysis.model`: the memory-traffic model and the roofline (no torch).
- `analysis.book`: what each chapter of the report computes from a results folder.
- Read by all three, torch-free: `families` (one entry per family), `schema` (the Parquet
  columns), `sources` (the hash of the kernel code a row ran).

The book and the bench never import each other; the book imports neither torch, triton nor the
kernels (tests/test_boundaries.py).
"""
