"""Interleaved host and device cost of linear_act fwd+bwd: main's backward (`old_backward` below:
dh in a new tensor, db summed in float32 then cast) against branch linear-act-backward-host's
(`la.backward` there: dh over h, db summed in the dtype), on one machine, swapped in the same
autograd.Function; eager and the floor beside; both checked against float64. Run it on that
branch (on main both sides are the same code). Run at dc4670e as .device/probe_linear_act.py,
PYTHONPATH at the repository root; its second shape then failed on the floor, fixed here."""
import statistics, sys, time
import torch, torch.nn.functional as F
from triton_fusion_report import kernels
from triton_fusion_report.kernels.families import linear_act as la
from triton_fusion_report.analysis.bench.launch_cost import host_us, _Nothing

def old_backward(dy, x, weight, bias, activation, need_dx, need_dw, need_db):
    h = torch.mm(x, weight) if bias is None else torch.addmm(bias, x, weight)
    dy = dy.contiguous()
    dh = torch.empty_like(h)
    block = 1024
    la.launch(la._activation_grad_kernel, (la.cdiv(h.numel(), block),), h, dy, dh, h.numel(),
              ACTIVATION=activation, BLOCK=block)
    return (dh @ weight.t() if need_dx else None, x.t() @ dh if need_dw else None,
            dh.sum(0, dtype=torch.float32).to(bias.dtype) if need_db else None)

bwd = la._LINEAR_ACT.function.backward
cell = bwd.__closure__[bwd.__code__.co_freevars.index("eager")]
new_backward = cell.cell_contents
assert new_backward is la.backward
def use(f): cell.cell_contents = f

dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
# correctness at GPT-2's MLP shape, bf16, both backwards against float64
torch.manual_seed(0)
for dtype in (torch.bfloat16, torch.float16):
    M, K, N = 8192, 768, 3072
    x = torch.randn(M, K, device=dev, dtype=dtype) ; w = torch.randn(K, N, device=dev, dtype=dtype) / K**0.5
    b = torch.randn(N, device=dev, dtype=dtype); dy = torch.randn(M, N, device=dev, dtype=dtype)
    leaves64 = [t.double().requires_grad_() for t in (x, w, b)]
    ref = torch.autograd.grad(F.gelu(torch.addmm(leaves64[2], leaves64[0], leaves64[1]), approximate="tanh"), leaves64, dy.double())
    for name, f in (("old", old_backward), ("new", new_backward)):
        use(f)
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        g = torch.autograd.grad(kernels.linear_act(*leaves, "gelu_tanh"), leaves, dy)
        err = [((a.double() - r).abs().max() / r.abs().max()).item() for a, r in zip(g, ref)]
        print(dtype, name, "rel err dx dw db", ["%.2e" % e for e in err], flush=True)

def fwd_bwd(f, leaves, grad):
    return lambda: torch.autograd.grad(f(*leaves), leaves, grad)

def case(M, K, N, dtype):
    leaves = tuple(t.requires_grad_() for t in (torch.randn(M, K, device=dev, dtype=dtype),
        torch.randn(K, N, device=dev, dtype=dtype) / K**0.5, torch.randn(N, device=dev, dtype=dtype)))
    dy = torch.randn(M, N, device=dev, dtype=dtype)
    eager = fwd_bwd(lambda x_, w_, b_: F.gelu(torch.addmm(b_, x_, w_), approximate="tanh"), leaves, dy)
    ours = fwd_bwd(lambda *a: kernels.linear_act(*a, "gelu_tanh"), leaves, dy)
    def old(): use(old_backward); return ours()
    def new(): use(new_backward); return ours()
    fns = dict(eager=eager, old=old, new=new)
    if M == N:  # _Nothing returns its first input's shape, which the output has only then
        fns["floor"] = fwd_bwd(_Nothing.apply, leaves, dy)
    return fns

def dev_ms(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize(); s = torch.cuda.Event(True); e = torch.cuda.Event(True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / n

for label, shape, dtype in (("64x64x64 fp16", (64, 64, 64), torch.float16),
                            ("8192x768x3072 bf16", (8192, 768, 3072), torch.bfloat16)):
    fns = case(*shape, dtype)
    samples = {k: [] for k in fns}
    for f in fns.values(): f()
    torch.cuda.synchronize()
    for _ in range(9):
        for k, f in fns.items():
            samples[k].append(host_us(f) if shape[0] == 64 else dev_ms(f) * 1e3)
    use(new_backward)
    unit = "host us/call" if shape[0] == 64 else "us/call (back-to-back, events)"
    print(label, unit, {k: "%.1f [%.1f, %.1f]" % (statistics.median(v), min(v), max(v)) for k, v in samples.items()}, flush=True)
    if shape[0] != 64:
        for k in ("eager", "old", "new"):
            torch.cuda.synchronize(); base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats(); fns[k](); torch.cuda.synchronize()
            print(label, k, "peak above inputs MiB %.1f" % ((torch.cuda.max_memory_allocated() - base) / 2**20), flush=True)
        use(new_backward)
