"""The ops as nn.Modules (kernels/modules.py): state dicts of PyTorch's modules load without
renaming and the outputs match PyTorch's modules; and `kernels.swap_in` (kernels/swap.py): what it
swaps and leaves in a plain model and in a Hugging Face GPT-2, the parameters shared, the loss as
the model's own."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from triton_fusion_report import kernels

from conftest import DEVICE, TOL, rel_err

pytestmark = pytest.mark.usefixtures("device")


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


def _out_and_grads(module, *inputs):
    x = inputs[0].detach().clone().requires_grad_()
    out = module(x, *inputs[1:])
    # a fixed random weighting (a sum of LayerNorm's outputs has no gradient but rounding's)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(12345)).to(out)
    out.backward(g)
    return out, [x.grad] + [p.grad for p in module.parameters()]


# linear_act's float32 products run in TF32 on a GPU (its default, as fast float32 GEMMs), in full
# float32 under the interpreter; nn.Linear's in IEEE float32.
LINEAR_TOL = 7.5e-4 if DEVICE.type == "cuda" else TOL[torch.float32]


def _same(ours, theirs, *inputs, tol=TOL[torch.float32]):
    out, grads = _out_and_grads(ours, *inputs)
    want, want_grads = _out_and_grads(theirs, *inputs)
    assert out.dtype == want.dtype and out.shape == want.shape
    assert rel_err(out, want.double()) <= 4 * tol
    for g, w in zip(grads, want_grads, strict=True):
        assert rel_err(g, w.double()) <= 20 * tol


@pytest.mark.parametrize("affine, bias", [(True, True), (True, False), (False, False)])
def test_layer_norm_module_loads_torch_state_dict(affine, bias):
    torch.manual_seed(0)
    theirs = nn.LayerNorm(40, eps=1e-6, elementwise_affine=affine, bias=bias, device=DEVICE)
    ours = kernels.LayerNorm(40, eps=1e-6, elementwise_affine=affine, bias=bias, device=DEVICE)
    assert isinstance(ours, nn.LayerNorm) and ours.state_dict().keys() == theirs.state_dict().keys()
    if affine:
        with torch.no_grad():
            theirs.weight.normal_(1.0, 0.2)
            if bias:
                theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())
    _same(ours, theirs, _r(2, 3, 40))
    with pytest.raises(ValueError, match="last dim only"):
        kernels.LayerNorm((4, 40))


@pytest.mark.parametrize("activation, bias", [("gelu", True), ("gelu_tanh", False),
                                              ("relu", True), ("none", True)])
def test_linear_act_module_loads_linear_state_dict(activation, bias):
    acts = {"gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"),
            "relu": F.relu, "none": lambda h: h}
    torch.manual_seed(0)
    linear = nn.Linear(16, 24, bias=bias, device=DEVICE)
    torch.manual_seed(0)
    ours = kernels.LinearAct(16, 24, bias=bias, activation=activation, device=DEVICE)
    # nn.Linear's parameters, names and initialisation
    assert ours.state_dict().keys() == linear.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(),
                                                linear.state_dict().values()))
    with torch.no_grad():
        for p in linear.parameters():
            p.normal_()
    ours.load_state_dict(linear.state_dict())
    _same(ours, nn.Sequential(linear, _Act(acts[activation])), _r(2, 5, 16), tol=LINEAR_TOL)
    with pytest.raises(ValueError, match="activation must be one of"):
        kernels.LinearAct(16, 24, activation="silu")


class _Act(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("bias", [False, True])
def test_linear_cross_entropy_module_loads_linear_state_dict(bias):
    torch.manual_seed(0)
    head = nn.Linear(16, 30, bias=bias, device=DEVICE)
    ours = kernels.LinearCrossEntropy(16, 30, bias=bias, device=DEVICE)
    ours.load_state_dict(head.state_dict())
    x, t = _r(2, 6, 16), torch.randint(0, 30, (2, 6), device=DEVICE)
    t[0, 0] = -100
    assert torch.equal(ours(x), head(x))  # no target: the logits, as the nn.Linear
    loss, grads = _out_and_grads(ours, x, t)
    want, want_grads = _out_and_grads(
        _Loss(head, lambda z: F.cross_entropy(z.reshape(-1, 30), t.reshape(-1))), x)
    assert loss.dtype == torch.float32 and rel_err(loss, want.double()) <= 4 * TOL[torch.float32]
    for g, w in zip(grads, want_grads, strict=True):
        assert rel_err(g, w.double()) <= 20 * TOL[torch.float32]
    total = kernels.LinearCrossEntropy.from_linear(head, reduction="sum")(x, t)
    assert rel_err(total, F.cross_entropy(head(x).reshape(-1, 30), t.reshape(-1),
                                          reduction="sum").double()) <= 4 * TOL[torch.float32]


class _Loss(nn.Module):
    def __init__(self, head, loss):
        super().__init__()
        self.head, self.loss = head, loss

    def forward(self, x):
        return self.loss(self.head(x))


def test_attention_module_is_sdpa_core():
    q, k, v = (_r(1, 2, 24, 16, dtype=torch.float16) for _ in range(3))
    module = kernels.Attention(causal=True, scale=0.3)
    assert not list(module.parameters()) and not module.state_dict()
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                          scale=0.3)
    assert rel_err(module(q, k, v), want) <= 4 * TOL[torch.float16]


class _Plain(nn.Module):
    """A model written with PyTorch's modules: what swap_in recognises and what it leaves."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(approximate="tanh"), nn.Linear(64, 32),
                                 nn.ReLU())
        self.norm2 = nn.LayerNorm((4, 8))
        self.attn = nn.MultiheadAttention(32, 2, batch_first=True)

    def forward(self, x):
        h = self.mlp(self.norm(x))
        return self.norm2(h.view(*h.shape[:-1], 4, 8)).flatten(-2)


def test_swap_in_a_plain_model():
    torch.manual_seed(0)
    model = _Plain().to(DEVICE)
    x = _r(2, 5, 32)
    want = model(x)
    params = dict(model.named_parameters())
    state = model.state_dict()
    report = kernels.swap_in(model, ops=["layer_norm", "mlp", "attention"])
    assert [p for p, _ in report.swapped] == ["norm", "mlp.0", "mlp.2"]
    assert report.count("LayerNorm") == 1 and report.count("LinearAct") == 2
    assert {p for p, _ in report.left} == {"norm2", "attn"}
    assert isinstance(model.mlp[1], nn.Identity) and model.mlp[2].activation == "relu"
    # the parameters shared, not copied; the state dict the same
    assert all(p is params[n] for n, p in model.named_parameters())
    assert model.state_dict().keys() == state.keys()
    assert rel_err(model(x), want.double()) <= 4 * LINEAR_TOL
    assert str(report).startswith("swapped 3:")
    with pytest.raises(ValueError, match="ops must be among"):
        kernels.swap_in(model, ops=["softmax"])
    again = kernels.swap_in(model)  # swapped already: nothing more
    assert not again.swapped


def test_swapped_model_trains_under_autocast_like_pytorchs():
    """The plain model swapped, a few AdamW steps in bf16 autocast with float32 parameters:
    losses within bf16's tolerance of the same model's with PyTorch's ops."""
    losses = {}
    for swapped in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32),
                              nn.LayerNorm(32)).to(DEVICE)
        if swapped:
            kernels.swap_in(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x, y = _r(16, 32), _r(16, 32)
        losses[swapped] = []
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                loss = F.mse_loss(model(x).float(), y)
            loss.backward()
            assert all(p.grad.dtype == torch.float32 for p in model.parameters())
            opt.step()
            losses[swapped].append(loss.item())
    assert losses[True][-1] < losses[True][0]
    for a, b in zip(losses[False], losses[True]):
        assert abs(a - b) <= 2 * TOL[torch.bfloat16] * abs(a), losses


def _gpt2(transformers, **config):
    config = transformers.GPT2Config(**dict(dict(
        n_layer=2, n_head=2, n_embd=32, vocab_size=67, n_positions=16, bos_token_id=0,
        eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0), **config))
    torch.manual_seed(0)
    with torch.device(DEVICE):
        return transformers.GPT2LMHeadModel(config)


def test_swap_in_gpt2():
    """Every LayerNorm, each MLP's c_fc + GELU, the attention and the LM head with its loss; the
    state dict, the tied head and the loss (bf16 autocast) as the model's own; no labels: the
    logits as before."""
    transformers = pytest.importorskip("transformers", reason="the GPT-2 swap needs transformers")
    ref, model = _gpt2(transformers), _gpt2(transformers)
    report = kernels.swap_in(model)
    assert not report.left, str(report)
    assert (report.count("LayerNorm"), report.count("LinearAct"), report.count("attention"),
            report.count("LinearCrossEntropy")) == (5, 2, 1, 1)
    assert model.state_dict().keys() == ref.state_dict().keys()
    assert model.lm_head.weight is model.transformer.wte.weight
    model.load_state_dict(ref.state_dict())  # loads as it is
    ids = torch.randint(0, 67, (2, 16), device=DEVICE)
    ids[1, -3:] = -100  # ignored labels
    labels = ids.clamp_min(0)
    labels[1, -3:] = -100
    ids = ids.clamp_min(0)
    results = {}
    for name, m in (("torch", ref), ("ours", model)):
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            out = m(ids, labels=labels)
        out.loss.backward()
        results[name] = (out, {n: p.grad for n, p in m.named_parameters()})
    (out, grads), (want, want_grads) = results["ours"], results["torch"]
    assert out.logits is None and out.loss.dtype == torch.float32
    assert abs(out.loss.item() - want.loss.item()) <= TOL[torch.bfloat16] * want.loss.item()
    assert grads.keys() == want_grads.keys()
    for n, g in grads.items():
        assert rel_err(g, want_grads[n].double()) <= 8 * TOL[torch.bfloat16], n
    with torch.no_grad(), torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        logits, want_logits = model(ids).logits, ref(ids).logits
        # transformers' loss over num_items_in_batch: the sum, divided by it
        count = torch.tensor(7, device=DEVICE)
        summed = model(ids, labels=labels, num_items_in_batch=count).loss
        want_summed = ref(ids, labels=labels, num_items_in_batch=count).loss
    assert logits.shape == (2, 16, 67) and rel_err(logits, want_logits.double()) <= 2 * TOL[
        torch.bfloat16]
    assert abs(summed.item() - want_summed.item()) <= TOL[torch.bfloat16] * want_summed.item()


def test_swap_in_gpt2_with_attention_dropout_refuses_to_train():
    transformers = pytest.importorskip("transformers", reason="the GPT-2 swap needs transformers")
    model = _gpt2(transformers, attn_pdrop=0.1)
    report = kernels.swap_in(model, ops=["attention"])
    assert "dropout p=0.1" in report.swapped[0][1]
    ids = torch.randint(0, 67, (1, 8), device=DEVICE)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        with pytest.raises(NotImplementedError, match="attention dropout"):
            model.train()(ids)
        assert model.eval()(ids).logits.shape == (1, 8, 67)
