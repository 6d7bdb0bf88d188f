"""LoRA adapters (train/nn_lora.py): the forward against its formula in NumPy, float64
gradcheck on A, B and x, frozen base (no gradient, no optimizer state), layer selection by
kind, name and glob, and the trace: plain linear nodes carrying W + (alpha/r) B A."""

import numpy as np
import pytest

from pocket.formats import reference
from pocket.train import backend, memory, nn, optim
from pocket.train.gradcheck import gradcheck
from pocket.train.nn_lora import LoRAError, LoRALinear, apply_lora, select
from pocket.train.nn_seqattn import TransformerEncoderBlock
from pocket.train.tensor import Parameter, Tensor
from pocket.train.trace import trace


def _lora(rng, n_in=5, n_out=3, rank=2, alpha=3.0, dropout=0.0, bias=True, dtype=np.float32):
    m = LoRALinear(nn.Linear(n_in, n_out, bias=bias, rng=rng), rank, alpha, dropout, rng)
    m.lora_B.data = rng.standard_normal(m.lora_B.shape).astype(dtype)  # B = 0 hides A's part
    for p in (m.weight, m.lora_A) + ((m.bias,) if bias else ()):
        p.data = p.data.astype(dtype)
    return m


def _np_forward(m, x, mask=None):
    w, a, b = (np.asarray(p.data, np.float64) for p in (m.weight, m.lora_A, m.lora_B))
    h = x if mask is None else x * mask
    y = x @ w.T + (h @ a.T) @ b.T * (m.alpha / m.rank)
    return y + (np.asarray(m.bias.data, np.float64) if m.bias is not None else 0)


def test_init_like_peft_and_starts_at_the_base(rng):
    base = nn.Linear(40, 7, rng=rng)
    x = rng.standard_normal((4, 40)).astype(np.float32)
    want = base(Tensor(x)).data.copy()
    m = LoRALinear(base, rank=6, alpha=12, rng=rng)
    assert m.weight is base.weight and m.bias is base.bias
    assert m.lora_A.shape == (6, 40) and m.lora_B.shape == (7, 6)
    bound = 1 / np.sqrt(40)  # kaiming_uniform(a=sqrt(5)) over fan_in = in_features
    assert np.abs(m.lora_A.data).max() <= bound and np.abs(m.lora_A.data).max() > bound / 2
    assert not m.lora_B.data.any()
    assert m.scaling == 2.0
    np.testing.assert_array_equal(m(Tensor(x)).data, want)


@pytest.mark.parametrize("bias", [True, False])
def test_forward_matches_the_formula(rng, bias):
    m = _lora(rng, 6, 4, rank=3, alpha=5.0, bias=bias)
    x = rng.standard_normal((2, 3, 6)).astype(np.float32)  # (N, L, in), as in attention
    np.testing.assert_allclose(m(Tensor(x)).data, _np_forward(m, x), rtol=1e-5, atol=1e-5)


def test_dropout_is_on_the_adapter_input_only(rng):
    m = _lora(rng, 8, 3, rank=2, dropout=0.5)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    backend.manual_seed(7)
    got = m(Tensor(x)).data
    backend.manual_seed(7)
    mask = backend.dropout_mask(x.shape, x, 0.5)
    np.testing.assert_allclose(got, _np_forward(m, x, mask), rtol=1e-5, atol=1e-5)
    m.eval()
    np.testing.assert_allclose(m(Tensor(x)).data, _np_forward(m, x), rtol=1e-5, atol=1e-5)


def test_gradcheck_a_b_and_x(rng):
    m = _lora(rng, 5, 3, rank=2, alpha=3.0, dtype=np.float64)
    m.eval()

    def fn(x, a, b):
        object.__setattr__(m, "lora_A", a)
        object.__setattr__(m, "lora_B", b)
        return m(x)

    gradcheck(fn, [rng.standard_normal((4, 5)), rng.standard_normal((2, 5)),
                   rng.standard_normal((3, 2))])


def _mlp(rng):
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 8, rng=rng), nn.ReLU(),
                         nn.Linear(8, 4, rng=rng))


@pytest.mark.parametrize("opt", ["sgd", "adam", "adamw"])
def test_frozen_base_gets_no_gradient_and_no_optimizer_state(rng, opt):
    model = _mlp(rng)
    apply_lora(model, 2, targets=["linear"], rng=rng)
    make = {"sgd": lambda p: optim.SGD(p, 0.1, momentum=0.9),
            "adam": lambda p: optim.Adam(p, 1e-2), "adamw": lambda p: optim.AdamW(p, 1e-2)}
    tracker = memory.reset_tracker()
    opt_ = make[opt](model)
    x = Tensor(rng.standard_normal((5, 1, 3, 4)).astype(np.float32))
    model(x).sum().backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == ("lora_" in name), name
    opt_.step()
    adapters = {n for n, _ in model.named_parameters() if "lora_" in n}
    assert set(opt_.state) == adapters
    assert set(opt_.state_dict()["state"]) == adapters
    trained = sum(p.data.nbytes for n, p in model.named_parameters() if n in adapters)
    assert tracker.live["gradients"] == trained
    assert tracker.live["optimizer_state"] == trained * (1 if opt == "sgd" else 2)
    s = memory.trainable_summary(model.named_parameters(), 1 if opt == "sgd" else 2)
    total = sum(p.data.size for p in model.parameters())
    assert s["trainable"] == sum(p.data.size for n, p in model.named_parameters()
                                 if n in adapters)
    assert s["fraction"] == pytest.approx(s["trainable"] / total)
    assert s["gradient_bytes"] == trained and s["full_gradient_bytes"] == total * 4


def test_wrapping_keeps_names_and_order(rng):
    model = _mlp(rng)
    keys = list(model.state_dict())
    assert apply_lora(model, 2, targets=["3"], rng=rng) == ["3"]
    assert [type(m).__name__ for m in model] == ["Flatten", "Linear", "ReLU", "LoRALinear"]
    assert list(model.state_dict()) == keys + ["3.lora_A", "3.lora_B"]
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)


def test_targets_by_kind_name_and_glob(rng):
    block = nn.Sequential(TransformerEncoderBlock(8, 2, mlp_ratio=1.0, rng=rng),
                          nn.Linear(8, 3, rng=rng))
    attn = [f"0.attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "out_proj")]
    assert select(block, ["attention"]) == attn
    assert select(block, ["linear"]) == attn + ["0.fc1", "0.fc2", "1"]
    assert select(block, ["q_proj", "v_proj"]) == ["0.attn.q_proj", "0.attn.v_proj"]
    assert select(block, ["0.fc*"]) == ["0.fc1", "0.fc2"]
    for bad, words in ((["nope"], "matched no linear layer"), (["ln1"], "LayerNorm"),
                       ([], "empty")):
        with pytest.raises(LoRAError, match=words):
            select(block, bad)
    with pytest.raises(LoRAError, match="rank"):
        apply_lora(block, 0, targets=["attention"])


def test_trace_emits_plain_linear_with_the_merged_weight(rng):
    model = nn.Sequential(nn.Linear(6, 5, rng=rng), nn.ReLU(), nn.Linear(5, 3, rng=rng))
    apply_lora(model, 2, alpha=4.0, targets=["linear"], rng=rng)
    for _, m in model.named_modules():
        if isinstance(m, LoRALinear):
            m.lora_B.data = rng.standard_normal(m.lora_B.shape).astype(np.float32)
    model.eval()
    g, params = trace(model, (6,))
    assert [n.op for n in g.nodes] == ["linear", "relu", "linear"]
    assert not any("lora" in k for k in params)
    w, a, b = (np.asarray(p.data, np.float64) for p in (model[0].weight, model[0].lora_A,
                                                        model[0].lora_B))
    np.testing.assert_allclose(params[g.nodes[0].inputs[1]], w + 2.0 * b @ a, rtol=1e-6,
                               atol=1e-7)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_allclose(reference.run(g, params, x)[g.outputs[0]],
                               model(Tensor(x)).data, rtol=1e-5, atol=1e-5)


def test_parameters_module_shares_the_base_parameters(rng):
    base = nn.Linear(3, 2, rng=rng)
    m = LoRALinear(base, 1)
    assert isinstance(m.weight, Parameter) and m.weight.requires_grad is False
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias", "lora_A", "lora_B"]


def test_forward_and_gradients_match_torch(rng):
    torch = pytest.importorskip("torch")
    m = _lora(rng, 7, 4, rank=3, alpha=6.0, dtype=np.float64)
    m.eval()
    x = rng.standard_normal((5, 7))
    tx, ta, tb = (torch.tensor(np.asarray(v), requires_grad=True)
                  for v in (x, m.lora_A.data, m.lora_B.data))
    tw, tbias = torch.tensor(m.weight.data), torch.tensor(m.bias.data)
    # PEFT's LoRA Linear forward: result + lora_B(lora_A(dropout(x))) * scaling
    ty = torch.nn.functional.linear(tx, tw, tbias) + \
        torch.nn.functional.linear(torch.nn.functional.linear(tx, ta), tb) * (6.0 / 3)
    gy = rng.standard_normal((5, 4))
    ty.backward(torch.tensor(gy))
    xt = Tensor(x, requires_grad=True)
    y = m(xt)
    y.backward(gy)
    np.testing.assert_allclose(y.data, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    for ours, theirs in ((xt.grad, tx.grad), (m.lora_A.grad, ta.grad), (m.lora_B.grad, tb.grad)):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-12, atol=1e-12)
    assert m.weight.grad is None and m.bias.grad is None


def test_trainable_layers_train_in_full(rng):
    from pocket.train.nn_seqattn import LayerNorm

    model = nn.Sequential(nn.Linear(6, 5, rng=rng), LayerNorm(5, elementwise_affine=False),
                          nn.Linear(5, 3, rng=rng))
    apply_lora(model, 2, targets=["0"], trainable=["1", "2"], rng=rng)
    grads = {n for n, p in model.named_parameters() if p.requires_grad}
    assert grads == {"0.lora_A", "0.lora_B", "2.weight", "2.bias"}  # LN without affine: frozen
    with pytest.raises(LoRAError, match="both in targets"):
        apply_lora(_mlp(rng), 2, targets=["linear"], trainable=["3"])
    with pytest.raises(LoRAError, match="trainable 'head' matched no layer"):
        apply_lora(_mlp(rng), 2, targets=["1"], trainable=["head"])


def test_a_synapse_inside_a_one_op_layer_is_no_target_and_never_dropped_silently(rng):
    from pocket.train.nn_spiking import SpikingLinear
    from pocket.train.trace import TraceError

    model = nn.Sequential(nn.Flatten(), SpikingLinear(6, 4, rng=rng), nn.Linear(4, 2, rng=rng))
    assert select(model, ["linear"]) == ["2"]  # the spiking layer's synapse is part of `lif`
    with pytest.raises(LoRAError, match=r"names 1.syn, the linear inside 1 \(SpikingLinear\)"):
        select(model, ["syn"])
    # wrapped by hand, the lif tracer would export the base weight: the trace refuses
    model[1].syn = LoRALinear(model[1].syn, 2)
    with pytest.raises(TraceError, match="adapter on '1.syn' is not in the traced graph"):
        trace(model.eval(), (2, 6))
