"""The traffic model's bytes and FLOPs per kernel of each implementation."""

import pytest

from triton_fusion_report.analysis.model import traffic


@pytest.mark.parametrize("itemsize", [2, 4])
def test_add_mul_traffic(itemsize):
    n = 1000
    e = n * itemsize
    assert traffic.add_mul_bytes(n, itemsize, "tensor", "triton_unfused") == 6 * e
    assert traffic.add_mul_bytes(n, itemsize, "tensor", "torch_eager") == 6 * e
    assert traffic.add_mul_bytes(n, itemsize, "tensor", "triton_fused") == 4 * e
    assert traffic.add_mul_bytes(n, itemsize, "tensor", "torch_compile") == 4 * e
    assert traffic.add_mul_bytes(n, itemsize, "scalar", "triton_unfused") == 5 * e
    assert traffic.add_mul_bytes(n, itemsize, "scalar", "triton_fused") == 3 * e
    unfused = traffic.add_mul_kernels(n, itemsize, "tensor", fused=False)
    assert [(k.read, k.written) for k in unfused] == [(2 * e, e), (2 * e, e)]
    assert traffic.add_mul_flops(n) == 2 * n
    with pytest.raises(ValueError, match="z_kind"):
        traffic.add_mul_bytes(n, itemsize, "vector", "triton_fused")


def test_traffic_table_totals():
    t = traffic.add_mul_table(10, 4)
    totals = t.groupby(["z", "variant"])["bytes"].sum()
    assert totals[("tensor", "unfused")] == 6 * 40 and totals[("scalar", "fused")] == 3 * 40


def test_softmax_backward_traffic():
    rows, width, s = 3, 1000, 2
    e = rows * width * s
    fused = traffic.softmax_backward_kernels(rows, width, s, "triton_fused")
    assert traffic.total(fused) == 3 * e  # read y, dy; write dx
    assert traffic.total(traffic.softmax_backward_kernels(rows, width, s, "torch_eager")) == 3 * e
    unfused = traffic.softmax_backward_kernels(rows, width, s, "triton_unfused")
    # y and dy read twice, the float32 row sums written once and read once.
    assert [(k.read, k.written) for k in unfused] == [(2 * e, 4 * rows), (2 * e + 4 * rows, e)]
    two_pass = traffic.softmax_backward_kernels(rows, width, s, "triton_fused", two_pass=True)
    assert traffic.total(two_pass) == 5 * e
    assert traffic.softmax_backward_flops(rows, width) == 4 * rows * width


def test_liger_lce_chunks():
    """Liger-Kernel's own chunking of its fused linear cross-entropy (a chunk's logits about as
    many elements as x, rows a power of two): 128-row chunks at GPT-2's and Llama-3's heads."""
    from triton_fusion_report.analysis.model.traffic import liger_lce_chunks

    assert liger_lce_chunks(8192, 768, 50257) == 64
    assert liger_lce_chunks(4096, 4096, 128256) == 32
    assert liger_lce_chunks(16384, 2048, 32000) == 16
    assert liger_lce_chunks(40, 24, 301) == 10  # ceil(40 / 13) = 4 rows a chunk
    assert liger_lce_chunks(100, 4096, 1024) == 1  # logits smaller than x: one chunk
