"""Everything that measures or models, knows the kernels, knows nothing about Quarto:

- `analysis.bench`: the benchmark (sweeps, timing, schema, machine limits, workers, one grid
  module per family group, the tail steps); `python -m triton_fusion_report.analysis.bench --help`.
- `analysis.model`: the memory-traffic model and the roofline (no torch).
- `analysis.book`: what each chapter of the report computes from a results folder.
"""
