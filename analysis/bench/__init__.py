"""The benchmark: `python -m triton_fusion_report.analysis.bench --out DIR` runs the sweeps.

- `__main__`: the command line; `families`: the families' grids and which problems a run takes;
  `run`: one process's run, --resume, and the merge of several workers' parts; `workers`: a
  sweep spread over several GPUs; `append`: adding one results folder's rows to another's.
- `sweep` (measure each implementation of a problem, write its row), `timing`, `machine` (run
  metadata, source hashes, the machine's limits), `summary`, `peers` (the peer Triton libraries).
  The Parquet columns (`analysis.schema`), the families (`analysis.families`) and the kernel hash
  (`analysis.sources`) are the book's too: they live above, torch-free.
- The grids, one module per family group: `elementwise`, `reductions`, `attention`,
  `matmul_epilogue`.
- The tail steps `make bench` runs after the sweep (`steps`): `seed002`, `launch_cost`,
  `model_check`, `lm_head_front`; `host_overhead`, a diagnostic run by hand; and `profile`
  (`make profile`, Nsight Compute).

Importing this package imports nothing heavy. The book imports nothing of it.
"""
