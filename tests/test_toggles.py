"""The modern toggles, each on the real model: RoPE, RMSNorm, QK-norm, the FFN's activations,
logit soft-capping and zero-initialised output projections. Each keeps the model causal, works on
both attention paths and under gptlab-inspect's trace; `model=modern` trains end to end, and bad
combinations exit 2 through the real console script before any data work."""

from __future__ import annotations

import math
import os
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F
from helpers import check, read_metrics, run_main
from torch import nn

from gptlab.cli.inspect_model import trace_forward
from gptlab.errors import ConfigError
from gptlab.model.gpt import GPT, GPTConfig
from gptlab.model.position import Rotary, sinusoidal_angles
from gptlab.run.checkpoints import Trained, check_architecture

os.environ.setdefault("TIKTOKEN_CACHE_DIR", "/work/shared/tiktoken_cache")
torch.set_num_threads(1)

V = 97
TOGGLES = {
    "rope": {"positional": "rope"},
    "rmsnorm": {"norm_layer": "rmsnorm"},
    "qk_norm": {"qk_norm": True},
    "gelu": {"activation": "gelu"},
    "relu2": {"activation": "relu2"},
    "swiglu": {"activation": "swiglu"},
    "softcap": {"logit_softcap": 5.0},
    "zero_init": {"zero_init": True},
    "all": {
        "positional": "rope",
        "norm_layer": "rmsnorm",
        "qk_norm": True,
        "activation": "swiglu",
        "logit_softcap": 5.0,
        "zero_init": True,
    },
}


def make_model(seed: int = 0, **overrides) -> GPT:
    kwargs = dict(
        vocab_size=V, context_length=16, d_model=32, num_heads=4, num_blocks=2, dropout=0.0
    )
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**kwargs)).eval()
    if kwargs.get("zero_init"):  # a trained model's projections are not zero: test the maths
        with torch.no_grad():
            for block in model.blocks:
                nn.init.normal_(block.attn.proj.weight, std=0.05)
                nn.init.normal_(block.ffn.down.weight, std=0.05)
    return model


def random_ids(batch: int = 2, length: int = 16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (batch, length), generator=g)


# ------------------------------------------------------------------ every toggle, both paths
@pytest.mark.parametrize("attention", ["manual", "sdpa"])
@pytest.mark.parametrize("toggle", TOGGLES)
def test_toggle_is_causal_and_trains(toggle, attention):
    """Shapes, causality (the output at t does not depend on tokens after t) and a backward pass
    that reaches every parameter, for each toggle on each attention path."""
    model = make_model(attention=attention, **TOGGLES[toggle])
    ids = random_ids()
    with torch.no_grad():
        before = model(ids)
        assert before.shape == (2, 16, V)
        for t in (0, 7, 14):
            changed = ids.clone()
            changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + torch.arange(15 - t)) % V
            after = model(changed)
            torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-5)
            assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :], atol=1e-4)
    model.train()
    logits = model(ids[:, :-1])
    F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("toggle", TOGGLES)
def test_manual_and_sdpa_agree_with_the_toggle(toggle):
    manual = make_model(seed=3, attention="manual", **TOGGLES[toggle])
    sdpa = make_model(seed=4, attention="sdpa", **TOGGLES[toggle])
    sdpa.load_state_dict(manual.state_dict())
    ids = random_ids(batch=3)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(ids), manual(ids), rtol=0, atol=1e-5)
        torch.testing.assert_close(sdpa(ids[:, :7]), manual(ids[:, :7]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("toggle", TOGGLES)
def test_inspect_trace_rebuilds_the_block_with_the_toggle(toggle):
    """gptlab-inspect's recomputation (Q, K, V -> QK-norm/RoPE -> scores -> softmax -> ·V) gives
    what the model's own attention merged, so the figures show the attention the model uses."""
    model = make_model(attention="sdpa", **TOGGLES[toggle])
    steps, trace = trace_forward(model, random_ids(), block=1)
    merged = trace["weighted"].transpose(1, 2).reshape(trace["merged"].shape)
    torch.testing.assert_close(merged, trace["merged"], rtol=0, atol=1e-5)
    assert dict((label, shape) for label, shape, _ in steps)["logits"] == [2, 16, V]


# ------------------------------------------------------------------ RoPE
def test_rope_rotates_pairs_and_keeps_only_relative_positions():
    head_size, length = 8, 16
    angles = sinusoidal_angles(length, head_size)
    assert angles.shape == (length, head_size // 2)
    torch.testing.assert_close(angles[3, 1], torch.tensor(3 / 10000 ** (2 / head_size)))
    rotary = Rotary(GPTConfig(context_length=length, d_model=head_size, num_heads=1))
    torch.testing.assert_close(rotary.cos, angles.cos(), rtol=0, atol=0)
    torch.testing.assert_close(rotary.sin, angles.sin(), rtol=0, atol=0)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 1, head_size, generator=g).expand(1, 1, length, head_size)
    k = torch.randn(1, 1, 1, head_size, generator=g).expand(1, 1, length, head_size)
    rq, rk = rotary(q), rotary(k)
    torch.testing.assert_close(rq[..., 0, :], q[..., 0, :])  # position 0: no rotation
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))  # a rotation keeps lengths
    scores = (rq @ rk.transpose(-2, -1))[0, 0]  # [T, T]: q at position m, k at position n
    for offset in (0, 1, 5):  # the same q, k: the score depends on m - n only
        diagonal = torch.diagonal(scores, offset=-offset)
        torch.testing.assert_close(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5, rtol=0)
    assert not torch.allclose(scores[5, 5], scores[5, 0])
    # pair 0 of position 1 turns by exactly 1 radian
    x = torch.zeros(1, 1, 2, head_size)
    x[..., 0] = 1.0
    turned = rotary(x)[0, 0, 1, :2]
    torch.testing.assert_close(turned, torch.tensor([math.cos(1.0), math.sin(1.0)]))
    # with a start, the positions begin there: row 0 of x at start 1 turns as row 1 at start 0
    torch.testing.assert_close(rotary(x[..., :1, :], start=1)[0, 0, 0, :2], turned)


def test_rope_model_has_no_positional_table_and_moves_with_the_window():
    """RoPE adds nothing to the embeddings; the attention sees only relative positions."""
    model = make_model(positional="rope")
    assert isinstance(model.position_embedding, nn.Identity)
    assert not list(model.position_embedding.parameters())
    assert not list(model.position_embedding.buffers())
    rotary = model.blocks[0].attn.rotary  # one for all blocks: the angles computed once
    assert isinstance(rotary, Rotary) and all(b.attn.rotary is rotary for b in model.blocks)
    assert not [k for k in model.state_dict() if "position" in k or "rotary" in k]
    ids = random_ids(batch=1)
    with torch.no_grad():
        torch.testing.assert_close(
            model.embed(ids), model.token_embedding(ids) * math.sqrt(32), rtol=0, atol=0
        )


# ------------------------------------------------------------------ norms and activations
def test_rmsnorm_blocks_use_torch_rmsnorm_without_bias():
    model = make_model(norm_layer="rmsnorm")
    norms = [m for m in model.modules() if isinstance(m, nn.RMSNorm)]
    assert len(norms) == 2 * 2 + 1  # two per block and the final one (pre-LN)
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    x = torch.randn(2, 5, 32) * 7 + 3
    y = model.blocks[0].ln1(x)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(2, 5), atol=1e-4, rtol=0)


def test_qk_norm_bounds_the_scores():
    """With unit-RMS queries and keys (gains at 1), |Q·Kᵀ/sqrt(head_size)| <= sqrt(head_size)."""
    model = make_model(qk_norm=True)
    model.blocks[0].attn.qkv.weight.data.mul_(100)  # huge projections
    _, trace = trace_forward(model, random_ids(), block=0)
    head_size = 8
    assert trace["scores"].abs().max() <= math.sqrt(head_size) + 1e-4
    q = trace["heads"]
    torch.testing.assert_close(q.pow(2).mean(-1), torch.ones_like(q[..., 0]), atol=1e-3, rtol=0)


@pytest.mark.parametrize(
    ("activation", "formula"),
    [
        ("relu", lambda f, x: F.relu(f.up(x))),
        ("gelu", lambda f, x: F.gelu(f.up(x))),
        ("gelu_new", lambda f, x: F.gelu(f.up(x), approximate="tanh")),  # GPT-2's
        ("relu2", lambda f, x: F.relu(f.up(x)) ** 2),
        ("swiglu", lambda f, x: F.silu(f.gate(x)) * f.up(x)),
    ],
)
def test_activation_formula_and_comparable_size(activation, formula):
    model = make_model(activation=activation)
    ffn = model.blocks[0].ffn
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        torch.testing.assert_close(ffn.hidden(x), formula(ffn, x))
        torch.testing.assert_close(ffn(x), ffn.down(formula(ffn, x)))
    relu_size = sum(p.numel() for p in make_model().blocks[0].ffn.parameters())
    size = sum(p.numel() for p in ffn.parameters())
    assert abs(size - relu_size) / relu_size < 0.01  # SwiGLU's 2/3 width keeps the count
    assert model.config.ffn_hidden == (85 if activation == "swiglu" else 128)


# ------------------------------------------------------------------ soft-capping, zero init
def test_logit_softcap_bounds_the_logits_and_zero_turns_it_off():
    capped = make_model(logit_softcap=2.0)
    plain = make_model(logit_softcap=0.0)
    with torch.no_grad():
        for model in (capped, plain):
            model.head.weight.mul_(1000)  # logits far beyond the cap
        ids = random_ids()
        raw = plain(ids)
        assert raw.abs().max() > 10
        out = capped(ids)
        assert out.abs().max() <= 2.0  # tanh saturates to exactly 1 in float32
        torch.testing.assert_close(out, 2.0 * torch.tanh(raw / 2.0))
        torch.testing.assert_close(make_model(logit_softcap=None)(ids), make_model()(ids))


def test_zero_init_zeroes_the_output_projections_only():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, d_model=32, num_heads=4, num_blocks=2, zero_init=True))
    for block in model.blocks:
        assert (block.attn.proj.weight == 0).all() and (block.ffn.down.weight == 0).all()
        assert block.attn.qkv.weight.std() > 0.01 and block.ffn.up.weight.std() > 0.01
        x = torch.randn(2, 5, 32)
        torch.testing.assert_close(block(x), x)  # pre-LN: each block starts as the identity


# ------------------------------------------------------------------ bad combinations
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"activation": "tanh2"}, ["model.activation='tanh2'", "relu", "gelu", "relu2", "swiglu"]),
        ({"norm_layer": "batchnorm"}, ["model.norm_layer='batchnorm'", "rmsnorm"]),
        ({"positional": "rope", "d_model": 30, "num_heads": 2}, ["rope", "head_size 15"]),
        ({"logit_softcap": -1.0}, ["model.logit_softcap=-1.0"]),
        ({"norm_eps": -1e-5}, ["model.norm_eps=-1e-05: it must be positive"]),
        ({"rope_theta": 0.0}, ["model.rope_theta=0.0: it must be positive"]),
        ({"mup_init": float("nan")}, ["model.mup_init=nan: it must be positive"]),
    ],
)
def test_bad_toggle_is_a_clear_error(overrides, expected):
    with pytest.raises(ConfigError) as info:
        GPTConfig(vocab_size=V, **overrides)
    for text in expected:
        assert text in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("positional", "rope"), ("norm_layer", "rmsnorm"), ("qk_norm", True), ("activation", "swiglu")]
    + [("logit_softcap", 30.0), ("norm_eps", 1e-6), ("rope_theta", 5e5)],
)
def test_ckpt_path_refuses_a_checkpoint_with_another_toggle(key, value):
    """A toggle that changes the weights' shapes or meaning is part of the architecture check;
    zero_init only sets the start, so a checkpoint continues under either."""
    saved = asdict(GPTConfig(vocab_size=V))
    tokenizer = {"encoding": "cl100k_base", "vocab": None}
    trained = Trained(saved, tokenizer, {}, 0)
    with pytest.raises(ConfigError, match=f"model.{key}"):
        check_architecture(
            "x.ckpt", trained, {"model": {**saved, key: value}, "tokenizer": tokenizer}
        )
    check_architecture(
        "x.ckpt", trained, {"model": {**saved, "zero_init": True}, "tokenizer": tokenizer}
    )


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            ["model.activation=tanh2"],
            "choose one of ('relu', 'gelu', 'gelu_new', 'relu2', 'swiglu')",
        ),
        (
            ["model.positional=rope", "model.d_model=30", "model.num_heads=2"],
            "head_size must be even",
        ),
    ],
)
def test_bad_toggle_exits_2_before_any_data_work(tmp_path, overrides, needle):
    result = run_main(
        "debug=fast",
        *overrides,
        "hydra.run.dir=run",
        cwd=tmp_path,
        env={"GPTLAB_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "cache").exists()  # nothing tokenized
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_model_modern_trains_with_debug_fast(tmp_path):
    """The preset end to end: a real run directory, a finite loss that fell, the toggles saved."""
    check(run_main("debug=fast", "model=modern", "hydra.run.dir=run", cwd=tmp_path))
    metrics = read_metrics(tmp_path / "run")
    assert metrics["status"] == "ok" and math.isfinite(metrics["best_val_loss"])
    assert metrics["best_val_loss"] < math.log(3771)  # below a uniform guess over the vocabulary
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    model = saved["hyper_parameters"]["model"]
    assert model["positional"] == "rope" and model["norm_layer"] == "rmsnorm"
    assert model["qk_norm"] and model["zero_init"] and model["activation"] == "relu2"
    assert any(k.endswith("attn.q_norm.weight") for k in saved["state_dict"])
