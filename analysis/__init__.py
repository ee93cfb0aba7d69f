"""Everything that measures or models: traffic model, timing, sweeps, figures.

Knows the kernels, knows nothing about Quarto. `python -m triton_fusion_report.analysis --help` runs the sweeps.
"""
