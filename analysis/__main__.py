"""`python -m triton_fusion_report.analysis`: the bench's old command, an alias of
`python -m triton_fusion_report.analysis.bench` (same arguments)."""
import sys

from .bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
