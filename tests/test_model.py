"""The project's LayerNorm and attention inside a tiny transformer (written here: no model library
in CI), through the interpreter: forward, backward and a few training steps against the same
block with PyTorch's ops, both measured against float64. analysis/bench/model_check.py does the same
with GPT-2 small on the GPU."""
import pytest
import torch
import torch.nn.functional as F

from triton_fusion_report import kernels

from conftest import FULL

VOCAB, DIM, HEADS, SEQ, BATCH = 50, 32, 2, 24, 2


class TinyTransformer(torch.nn.Module):
    """Embedding, one pre-norm block (causal attention from one QKV projection, GELU MLP), final
    LayerNorm, LM head. ops: "torch" or "triton"; attention runs in attn_dtype (float16 on the
    Triton kernel's side; float64 for the reference), the rest in the parameters' dtype."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, DIM) * 0.1)
        self.ln1, self.ln2, self.ln_f = (torch.nn.LayerNorm(DIM) for _ in range(3))
        for ln in (self.ln1, self.ln2, self.ln_f):  # not the identity: the weights matter
            torch.nn.init.normal_(ln.weight, 1.0, 0.2)
            torch.nn.init.normal_(ln.bias, 0.0, 0.2)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.fc = torch.nn.Linear(DIM, 4 * DIM)
        self.fc_out = torch.nn.Linear(4 * DIM, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, ids, ops: str, attn_dtype=torch.float16):
        return self.head(self.hidden(ids, ops, attn_dtype))

    def hidden(self, ids, ops: str, attn_dtype=torch.float16):
        """The final LayerNorm's output, the LM head's input."""
        ln = (lambda x, m: kernels.layer_norm(x, m.weight, m.bias, m.eps)) if ops == "triton" \
            else (lambda x, m: F.layer_norm(x, (DIM,), m.weight, m.bias, m.eps))
        b, s = ids.shape
        x = self.emb(ids) + self.pos[:s]
        qkv = self.qkv(ln(x, self.ln1)).to(attn_dtype).view(b, s, 3, HEADS, DIM // HEADS)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # strided views, no copy
        if ops == "triton":
            a = kernels.attention(q, k, v, causal=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, DIM).to(x.dtype))
        x = x + self.fc_out(F.gelu(self.fc(ln(x, self.ln2))))
        return ln(x, self.ln_f)


def _loss(model, ids, ops, attn_dtype=torch.float16):
    logits = model(ids[:, :-1], ops, attn_dtype)
    return F.cross_entropy(logits.reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def _grads(model, ids, ops, attn_dtype=torch.float16):
    model.zero_grad(set_to_none=True)
    loss = _loss(model, ids, ops, attn_dtype)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _ids(device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g).to(device)


def test_tiny_transformer_forward_backward(device):
    """Loss and every parameter's gradient with the project's ops are as close to float64 as
    PyTorch's own float16-attention run (within 2x, or 1e-3)."""
    torch.manual_seed(0)
    model = TinyTransformer().to(device)
    ids = _ids(device, 0)
    ref_loss, ref = _grads(model.double(), ids, "torch", torch.float64)
    model.float()
    errs = {}
    for ops in ("torch", "triton"):
        loss, grads = _grads(model, ids, ops)
        errs[ops] = max([abs(loss - ref_loss) / ref_loss] + [
            ((g.double() - ref[n]).abs().max() / ref[n].abs().max()).item()
            for n, g in grads.items()])
    assert errs["triton"] <= max(2 * errs["torch"], 1e-3), errs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_training_step_with_every_op_captures_in_one_cuda_graph(device):
    """Forward (LayerNorm, attention, the LM head's loss), backward and AdamW captured as one
    CUDA graph, as a training loop removes the host's cost: three replays on fresh batches give
    the parameters of three eager steps."""
    def loss_of(model, ids):
        h = model.hidden(ids[:, :-1], "triton")
        return kernels.linear_cross_entropy(h.reshape(-1, DIM), model.head.weight,
                                            ids[:, 1:].reshape(-1), model.head.bias)

    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(TinyTransformer().to(device))
    eager, captured = models
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3, capturable=True) for m in models]
    for step in range(3):
        opts[0].zero_grad(set_to_none=True)
        loss_of(eager, _ids(device, step)).backward()
        opts[0].step()
    ids = _ids(device, 0).clone()
    first = [p.detach().clone() for p in captured.parameters()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile, plan and make AdamW's state outside the capture
        loss_of(captured, ids).backward()
        opts[1].step()
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad():  # then back to the first step's weights and state
        for p, p0 in zip(captured.parameters(), first):
            p.copy_(p0)
        for state in opts[1].state.values():
            for t in state.values():
                t.zero_()
    opts[1].zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss_of(captured, ids).backward()
        opts[1].step()
    # The capture ran nothing: the parameters are the initial ones until the replays.
    for step in range(3):
        ids.copy_(_ids(device, step))
        graph.replay()
    torch.cuda.synchronize()
    for (name, a), b in zip(eager.named_parameters(), captured.parameters()):
        assert (a - b).abs().max() <= 1e-3 * a.abs().max() + 1e-5, name


@FULL
def test_tiny_transformer_training_steps(device):
    """Five AdamW steps from the same weights on the same batches: losses within 1% of PyTorch's
    at every step."""
    losses = {}
    for ops in ("torch", "triton"):
        torch.manual_seed(0)
        model = TinyTransformer().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses[ops] = []
        for step in range(5):
            opt.zero_grad(set_to_none=True)
            loss = _loss(model, _ids(device, step), ops)
            loss.backward()
            opt.step()
            losses[ops].append(loss.item())
    assert losses["torch"][-1] < losses["torch"][0]  # it trains: the comparison means something
    for a, b in zip(losses["torch"], losses["triton"]):
        assert abs(b - a) <= 0.01 * abs(a), losses


def test_swapped_attention_refuses_padding_masks_and_dropout(device):
    """The transformers adapter (kernels.swap) takes the causal mask (bool or additive) and
    refuses others, and dropout."""
    from triton_fusion_report.kernels import swap

    q = torch.randn(1, 2, 5, 16, device=device, dtype=torch.float16)
    causal = torch.ones(5, 5, dtype=torch.bool, device=device).tril()[None, None]
    module = type("M", (), {"is_causal": True})()
    out, weights = swap.attention_forward(module, q, q, q, causal)
    assert out.shape == (1, 5, 2, 16) and weights is None
    additive = torch.zeros(1, 1, 5, 5, device=device).masked_fill(~causal, float("-inf"))
    assert torch.equal(swap.attention_forward(module, q, q, q, additive)[0], out)
    assert torch.equal(swap.attention_forward(module, q, q, q, None)[0], out)
    padded = causal.clone()
    padded[..., 0] = False
    with pytest.raises(NotImplementedError, match="causal mask"):
        swap.attention_forward(module, q, q, q, padded)
    with pytest.raises(NotImplementedError, match="dropout"):
        swap.attention_forward(module, q, q, q, None, dropout=0.1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_swapped_attention_with_a_causal_mask_captures(device):
    """Under CUDA-graph capture transformers passes the causal mask it skips otherwise: the
    adapter checks it on the device (no host sync, which would end the capture), so the call
    captures and replays as the eager one."""
    from triton_fusion_report.kernels import swap

    q = torch.randn(2, 2, 64, 16, device=device, dtype=torch.float16)
    causal = torch.ones(64, 64, dtype=torch.bool, device=device).tril()[None, None]
    module = type("M", (), {"is_causal": True})()
    want = swap.attention_forward(module, q, q, q, causal)[0]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = swap.attention_forward(module, q, q, q, causal)[0]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_a_padded_batch_is_refused_not_silently_unmasked(device):
    """GPT-2 with the project's attention (transformers' interface, as kernels.swap_in puts it
    in): a batch without padding runs (no mask is made); a padded one raises, where transformers
    would otherwise hand a custom implementation no mask and the padding would be ignored."""
    transformers = pytest.importorskip("transformers", reason="the swap's attention adapter "
                                                              "needs transformers")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64,
                                     n_positions=16, bos_token_id=0, eos_token_id=0,
                                     attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    with torch.device(device):
        model = transformers.GPT2LMHeadModel(config).to(torch.float16)
    report = kernels.swap_in(model, ops=["attention"])
    assert report.count("attention") == 1 and not report.left
    ids = torch.randint(0, 64, (2, 16), device=device)
    assert model(ids).logits.shape == (2, 16, 64)
    padded = torch.ones(2, 16, dtype=torch.long, device=device)
    padded[1, :4] = 0
    with pytest.raises(NotImplementedError, match="causal mask"):
        model(ids, attention_mask=padded)


def test_model_check_times_with_the_collector_off_and_restores_it():
    """The GPT-2 check's timed steps run with Python's cyclic collector off (as training frameworks
    run it); afterwards it is as it was, on or off, also when the block raises."""
    import gc

    from triton_fusion_report.analysis.bench.model_check import collector_off

    assert gc.isenabled()
    with collector_off():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError), collector_off():
        1 / 0
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_off():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()
