"""Triton kernels, one module per fusion family; each holds `reference`, `triton_unfused` and
`triton_fused` side by side. The public API is the plain functions re-exported here."""
from ._common import poisoned_outputs
from .elementwise import add_mul

__all__ = ["add_mul", "poisoned_outputs"]
