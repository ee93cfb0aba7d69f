"""The models the measurements are put against, pandas only (no torch): `traffic` (the bytes
and FLOPs each kernel of each implementation must move and do), `roofline` (a chain of
kernels' time at the machine's limits) and `counters` (Nsight Compute's DRAM bytes against the
model)."""
