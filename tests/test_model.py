"""The GPT itself: the article's shapes, causality, both attention paths, the sinusoidal table,
every architecture switch, generation, config errors and parameter counts."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch import nn

import gptlab.model.position as position_module
from gptlab.cli.inspect_model import trace_forward
from gptlab.data.tokenizer import Tokenizer
from gptlab.errors import ConfigError
from gptlab.model.gpt import GPT, GPTConfig
from gptlab.model.position import LearnedEmbedding, SinusoidalEncoding

os.environ.setdefault("TIKTOKEN_CACHE_DIR", "/work/shared/tiktoken_cache")
torch.set_num_threads(1)  # small tensors: one thread is fastest, and robust to a busy machine

V = 97  # small vocabulary for the tests that do not need a real tokenizer

TEXT = (
    "Building rapport is a fundamental skill in sales that cannot be underestimated. It lays "
    "the foundation for establishing a connection with your potential customers, gaining their "
    "trust, and ultimately convincing them to make a purchase. Rapport can be defined as a "
    "harmonious relationship based on mutual understanding and empathy. When you build rapport "
    "with someone, you create a sense of familiarity, comfort, and shared interests, making it "
    "easier to communicate and influence their decision-making process."
)


def small_config(**overrides) -> GPTConfig:
    kwargs = dict(
        vocab_size=V, context_length=16, d_model=32, num_heads=4, num_blocks=2, dropout=0.0
    )
    kwargs.update(overrides)
    return GPTConfig(**kwargs)


def make_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(small_config(**overrides)).eval()


def random_ids(batch: int = 2, length: int = 16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (batch, length), generator=g)


# ------------------------------------------------------------------ the article's shape walk
def test_article_shape_walk():
    """ids [4,16] -> embeddings [4,16,64] -> heads [4,4,16,16] -> scores [4,4,16,16]
    -> merged [4,16,64] -> logits [4,16,V], with V a real compact tiktoken vocabulary."""
    tiktoken_ids = Tokenizer("cl100k_base").encode_tiktoken(TEXT)
    tokenizer = Tokenizer.fit("cl100k_base", tiktoken_ids, compact=True)
    vocab = tokenizer.vocab_size
    assert vocab == len(set(tiktoken_ids.tolist()))
    ids = torch.tensor(tokenizer.encode(TEXT)[: 4 * 16]).view(4, 16)

    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=vocab, context_length=16, d_model=64, num_heads=4, num_blocks=1, dropout=0.0
        )
    ).eval()
    with torch.no_grad():
        embeddings = model.embed(ids)
        logits = model(ids)
    _, trace = trace_forward(model, ids, block=0)

    assert ids.shape == (4, 16)
    assert embeddings.shape == (4, 16, 64)
    for name in ("q", "k", "v"):
        assert trace[name].shape == (4, 16, 64)
    assert trace["heads"].shape == (4, 4, 16, 16)  # [batch, heads, T, head_size=64/4]
    assert trace["scores"].shape == (4, 4, 16, 16)  # [batch, heads, T, T]
    assert trace["masked"].shape == (4, 4, 16, 16)
    assert trace["softmax"].shape == (4, 4, 16, 16)
    assert trace["weighted"].shape == (4, 4, 16, 16)
    assert trace["merged"].shape == (4, 16, 64)
    assert trace["wo"].shape == (4, 16, 64)
    assert logits.shape == (4, 16, vocab)

    # the masked scores are -inf exactly above the diagonal; softmax rows sum to 1
    future = torch.triu(torch.ones(16, 16, dtype=torch.bool), diagonal=1)
    assert torch.isneginf(trace["masked"][..., future]).all()
    assert torch.isfinite(trace["masked"][..., ~future]).all()
    assert (trace["softmax"][..., future] == 0).all()
    torch.testing.assert_close(trace["softmax"].sum(-1), torch.ones(4, 4, 16))
    # scores are Q·Kᵀ / sqrt(head_size)
    q = trace["q"].view(4, 16, 4, 16).transpose(1, 2)
    k = trace["k"].view(4, 16, 4, 16).transpose(1, 2)
    torch.testing.assert_close(trace["scores"], q @ k.transpose(-2, -1) / 4.0)


# ------------------------------------------------------------------ causality and the two paths
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_causal_future_tokens_do_not_change_past_logits(attention, norm):
    model = make_model(attention=attention, norm=norm)
    ids = random_ids()
    with torch.no_grad():
        before = model(ids)
        for t in (0, 5, 14):
            changed = ids.clone()
            changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + torch.arange(15 - t)) % V
            after = model(changed)
            torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-6)
            # the later positions do see the change
            assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :], atol=1e-4)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_manual_and_sdpa_agree(norm):
    manual = make_model(seed=3, attention="manual", norm=norm, num_blocks=3)
    sdpa = make_model(seed=4, attention="sdpa", norm=norm, num_blocks=3)
    ids = random_ids(batch=3, length=16)
    with torch.no_grad():
        assert not torch.allclose(manual(ids), sdpa(ids), atol=1e-5)  # different weights first
        sdpa.load_state_dict(manual.state_dict())
        out_manual = manual(ids)
        out_sdpa = sdpa(ids)
        torch.testing.assert_close(out_sdpa, out_manual, rtol=0, atol=1e-5)
        # also on a sequence shorter than context_length
        torch.testing.assert_close(sdpa(ids[:, :7]), manual(ids[:, :7]), rtol=0, atol=1e-5)


def test_traced_steps_of_an_sdpa_model_rebuild_its_output():
    """The article's steps recomputed from an sdpa model's Q, K, V give its own output."""
    model = make_model(attention="sdpa")
    ids = random_ids()
    _, trace = trace_forward(model, ids, block=1)
    attn = model.blocks[1].attn
    merged = trace["weighted"].transpose(1, 2).reshape(trace["merged"].shape)
    torch.testing.assert_close(merged, trace["merged"], rtol=0, atol=1e-5)
    torch.testing.assert_close(attn.proj(merged), trace["wo"], rtol=0, atol=1e-5)


def test_input_longer_than_context_length_is_refused():
    model = make_model()
    with pytest.raises(ValueError, match="context_length=16"):
        model(random_ids(length=17))


# ------------------------------------------------------------------ sinusoidal positional encoding
def test_sinusoidal_table_matches_the_formula():
    d_model = 32
    model = make_model(positional="sinusoidal", d_model=d_model)
    pe = model.position_embedding.table
    assert pe.shape == (16, d_model)
    for pos in (0, 1, 5, 15):
        for i in (0, 1, 7, 15):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    # and it is what embed() adds to the scaled token embedding
    ids = random_ids()
    with torch.no_grad():
        tokens = model.token_embedding(ids) * math.sqrt(d_model)
        torch.testing.assert_close(model.embed(ids) - tokens, pe.expand(2, 16, d_model))


def test_sinusoidal_table_is_a_buffer_computed_once(monkeypatch):
    model = make_model(positional="sinusoidal")
    pe = model.position_embedding.table
    assert "position_embedding.table" in dict(model.named_buffers())
    assert not [k for k in model.state_dict() if k.startswith("position_embedding")]
    assert not pe.requires_grad
    assert all(p is not pe for p in model.parameters())

    def fail(*args, **kwargs):
        raise AssertionError("sinusoidal_angles called again during forward")

    monkeypatch.setattr(position_module, "sinusoidal_angles", fail)
    with torch.no_grad():
        model(random_ids())
        model(random_ids(length=9))
    assert model.position_embedding.table is pe
    assert model.position_embedding.table.data_ptr() == pe.data_ptr()


# ------------------------------------------------------------------ architecture switches
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_norms_and_positionals_forward_and_backward(norm, positional):
    model = make_model(norm=norm, positional=positional).train()
    ids = random_ids()
    logits = model(ids)
    assert logits.shape == (2, 16, V)
    assert torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert isinstance(model.ln_f, nn.LayerNorm if norm == "pre" else nn.Identity)
    learned = positional == "learned"
    assert isinstance(model.position_embedding, LearnedEmbedding) == learned
    assert isinstance(model.position_embedding, SinusoidalEncoding) == (not learned)
    assert ("position_embedding.weight" in model.state_dict()) == learned


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_block_follows_its_norm_formula(norm):
    """post: x = LN(x + sublayer(x)) (the article's Add & Norm); pre: x = x + sublayer(LN(x))."""
    model = make_model(norm=norm)
    block = model.blocks[0]
    with torch.no_grad():
        for ln in (block.ln1, block.ln2):  # non-trivial gains and shifts
            ln.weight.normal_(1.0, 0.5)
            ln.bias.normal_(0.0, 0.5)
        x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0))
        if norm == "post":
            h = block.ln1(x + block.attn(x))
            expected = block.ln2(h + block.ffn(h))
        else:
            h = x + block.attn(block.ln1(x))
            expected = h + block.ffn(block.ln2(h))
        torch.testing.assert_close(block(x), expected)


def test_tie_weights_shares_the_tensor():
    tied = make_model(tie_weights=True)
    untied = make_model(tie_weights=False)
    assert tied.head.weight is tied.token_embedding.weight
    assert untied.head.weight is not untied.token_embedding.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == V * 32
    # a gradient step through the head moves the embedding too
    opt = torch.optim.SGD(tied.parameters(), lr=1.0)
    before = tied.token_embedding.weight.detach().clone()
    tied.head(torch.ones(1, 32)).sum().backward()
    opt.step()
    assert not torch.equal(tied.token_embedding.weight, before)
    assert tied.head.weight is tied.token_embedding.weight


def test_bias_false_has_no_biases():
    without = make_model(bias=False)
    assert not [n for n, _ in without.named_parameters() if n.endswith("bias")]
    for module in without.modules():
        if isinstance(module, (nn.Linear, nn.LayerNorm)):
            assert module.bias is None
    with torch.no_grad():
        assert without(random_ids()).shape == (2, 16, V)
    with_bias = make_model(bias=True)
    assert [n for n, _ in with_bias.named_parameters() if n.endswith("bias")]


def test_odd_d_model_works_with_learned_positions():
    model = make_model(d_model=33, num_heads=3, positional="learned")
    with torch.no_grad():
        assert model(random_ids()).shape == (2, 16, V)


# ------------------------------------------------------------------ generation
def test_generate_length_and_context_crop():
    model = make_model()
    prompt = random_ids(batch=2, length=5)
    out = model.generate(
        prompt, max_new_tokens=7, temperature=1.0, generator=torch.Generator().manual_seed(0)
    )
    assert out.shape == (2, 12)
    assert torch.equal(out[:, :5], prompt)
    assert out.min() >= 0 and out.max() < V

    # a prompt longer than context_length works: only its last 16 tokens are seen. With tied
    # weights and small learned positions an untrained model echoes its last input token, so
    # the first new token tells which 16 tokens it saw.
    echo = make_model(tie_weights=True, positional="learned")
    long_prompt = random_ids(batch=2, length=23, seed=5)
    out = echo.generate(long_prompt, max_new_tokens=4, temperature=0)
    assert out.shape == (2, 27)
    assert torch.equal(out[:, :23], long_prompt)
    with torch.no_grad():
        last_window = echo(long_prompt[:, -16:])[:, -1].argmax(-1)
        first_window = echo(long_prompt[:, :16])[:, -1].argmax(-1)
        assert not torch.equal(last_window, first_window)  # the check below can tell them apart
        assert torch.equal(out[:, 23], last_window)
        assert torch.equal(out[:, 24], echo(out[:, 24 - 16 : 24])[:, -1].argmax(-1))


def test_generate_stream_yields_one_token_at_a_time():
    model = make_model()
    prompt = random_ids(batch=1, length=3)
    steps = list(model.generate_stream(prompt, max_new_tokens=4, temperature=0))
    assert len(steps) == 4 and all(s.shape == (1, 1) for s in steps)
    assert torch.equal(torch.cat([prompt, *steps], 1), model.generate(prompt, 4, temperature=0))


def test_temperature_zero_is_greedy_and_deterministic():
    model = make_model()
    prompt = random_ids(batch=3, length=4)
    a = model.generate(prompt, max_new_tokens=10, temperature=0)
    torch.manual_seed(123)
    b = model.generate(prompt, max_new_tokens=10, temperature=0)
    assert torch.equal(a, b)
    ids = prompt
    with torch.no_grad():
        for _ in range(10):  # greedy by hand
            ids = torch.cat([ids, model(ids[:, -16:])[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(a, ids)


def test_top_k_1_equals_greedy():
    model = make_model()
    prompt = random_ids(batch=3, length=4)
    greedy = model.generate(prompt, max_new_tokens=10, temperature=0)
    for seed in (0, 1):
        top1 = model.generate(
            prompt,
            max_new_tokens=10,
            temperature=1.5,
            top_k=1,
            generator=torch.Generator().manual_seed(seed),
        )
        assert torch.equal(top1, greedy)


def test_top_k_restricts_to_the_k_most_likely():
    model = make_model()
    prompt = random_ids(batch=1, length=4)
    with torch.no_grad():
        allowed = set(model(prompt)[0, -1].topk(3).indices.tolist())
    for seed in range(20):
        out = model.generate(
            prompt, 1, temperature=5.0, top_k=3, generator=torch.Generator().manual_seed(seed)
        )
        assert out[0, -1].item() in allowed


def test_same_seed_same_tokens():
    model = make_model()
    prompt = random_ids(batch=2, length=4)

    def sample(seed):
        return model.generate(
            prompt,
            max_new_tokens=20,
            temperature=1.0,
            top_k=None,
            generator=torch.Generator().manual_seed(seed),
        )

    first = sample(42)
    torch.manual_seed(999)  # the global RNG must not matter
    assert torch.equal(sample(42), first)
    assert not torch.equal(sample(43), first)


# ------------------------------------------------------------------ configuration errors
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"d_model": 64, "num_heads": 3}, ["model.d_model=64", "model.num_heads=3"]),
        ({"d_model": 0}, ["model.d_model=0"]),
        ({"d_model": -8}, ["model.d_model=-8"]),
        ({"num_heads": 0}, ["model.num_heads=0"]),
        ({"num_blocks": 0}, ["model.num_blocks=0"]),
        ({"context_length": -1}, ["model.context_length=-1"]),
        ({"ffn_mult": 0}, ["model.ffn_mult=0"]),
        ({"vocab_size": 0}, ["model.vocab_size=0"]),
        ({"d_model": 32.0}, ["model.d_model=32.0"]),
        ({"dropout": 1.0}, ["model.dropout=1.0"]),
        ({"dropout": -0.1}, ["model.dropout=-0.1"]),
        ({"norm": "middle"}, ["model.norm='middle'", "pre", "post"]),
        ({"positional": "rotary"}, ["model.positional='rotary'", "sinusoidal", "learned"]),
        ({"attention": "flash"}, ["model.attention='flash'", "manual", "sdpa"]),
        (
            {"d_model": 63, "num_heads": 3, "positional": "sinusoidal"},
            ["model.d_model=63", "sinusoidal"],
        ),
    ],
)
def test_bad_model_config_is_a_clear_error(overrides, expected):
    with pytest.raises(ConfigError) as info:
        small_config(**overrides)
    for text in expected:
        assert text in str(info.value)
    assert isinstance(info.value, ValueError)


def test_model_without_vocab_size_is_a_clear_error():
    config = GPTConfig(vocab_size=None)  # allowed until the data module fills it in
    with pytest.raises(ConfigError, match="model.vocab_size"):
        GPT(config)


# ------------------------------------------------------------------ parameter counts
@pytest.mark.parametrize(
    "overrides",
    [{}, {"positional": "learned"}, {"tie_weights": True}, {"bias": False}, {"norm": "post"}],
)
def test_parameter_counts(overrides):
    model = make_model(**overrides)
    config = model.config
    counts = model.num_params()
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["embedding"] + counts["non_embedding"] == counts["total"]

    # independently, from the architecture
    d = config.d_model
    h = config.ffn_mult * config.d_model
    b = int(config.bias)
    per_block = (3 * d * d + 3 * d * b) + (d * d + d * b)  # Wq,Wk,Wv and Wo
    per_block += (d * h + h * b) + (h * d + d * b)  # feed-forward
    per_block += 2 * (d + d * b)  # two LayerNorms
    embedding = V * d + (config.context_length * d if config.positional == "learned" else 0)
    final_norm = (d + d * b) if config.norm == "pre" else 0
    head = 0 if config.tie_weights else V * d
    assert counts["embedding"] == embedding
    assert counts["total"] == embedding + config.num_blocks * per_block + final_norm + head


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_weights": True, "positional": "learned"},
        {"activation": "swiglu", "num_blocks": 3},
        {"ffn_mult": 2, "bias": False, "qk_norm": True, "positional": "rope"},
    ],
)
def test_the_models_own_accounting_is_the_scaling_law_formula(overrides):
    """GPT.scaling_params: per block 4 d_model² (Wq, Wk, Wv, Wo) and the FFN's 2 (SwiGLU: 3)
    matrices of ffn_hidden x d_model, plus the head's vocab x d_model; GPT.flops_per_token: 6 per
    such weight plus attention's 12 num_blocks context_length d_model."""

    model = make_model(**overrides)
    c = model.config
    ffn = (3 if c.activation == "swiglu" else 2) * c.ffn_hidden * c.d_model
    expected = c.num_blocks * (4 * c.d_model**2 + ffn) + c.d_model * c.vocab_size
    assert model.scaling_params() == expected
    attention = 12 * c.num_blocks * c.context_length * c.d_model
    assert model.flops_per_token() == 6 * expected + attention


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_only_the_manual_path_holds_a_mask(attention):
    """sdpa masks inside its kernel (is_causal), so no context_length² buffer is built for it."""
    model = make_model(attention=attention)
    masks = [name for name, _ in model.named_buffers() if name.endswith("attn.mask")]
    assert len(masks) == (2 if attention == "manual" else 0)
    assert "mask" not in "".join(model.state_dict())


# ------------------------------------------------------------------ built once, on meta first
PRESETS = {  # model=<option> overrides, and the toggles whose draws differ
    "default": [],
    "modern": ["model=modern"],
    "tiny": ["model=tiny"],
    "reference": ["model=reference"],
    "zero_init": ["model.zero_init=true"],
    "tie_weights": ["model.tie_weights=true"],
    "mup": ["model.parametrization=mup", "model.base_width=64", "model.mup_init=2.0"],
    "learned swiglu": ["model.positional=learned", "model.activation=swiglu", "model.bias=false"],
}


def preset(overrides: list[str]) -> GPTConfig:
    """The model group's settings as gptlab-train composes them, with a small vocabulary."""
    from hydra import compose, initialize_config_module

    from gptlab.config.schemas import register_configs

    register_configs()
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        cfg = compose("train", ["data.context_length=16", *overrides])
    settings = {k: v for k, v in cfg.model.items() if k != "_target_"}
    return GPTConfig(**{**settings, "vocab_size": V, "dropout": 0.0})


@pytest.mark.parametrize("name", PRESETS)
def test_a_model_built_on_meta_draws_the_numbers_gpt_draws(name):
    """build_gpt builds on torch's meta device, then replays torch's draws in GPT(config)'s
    order: for the same seed the same tensors, bit for bit (parameters and tables), ties kept,
    and torch's generator left where GPT(config) leaves it (dropout draws the same next)."""
    from gptlab.model.meta import build_gpt

    config = preset(PRESETS[name])
    for seed in (0, 7):
        torch.manual_seed(seed)
        old = GPT(config)  # built directly on the CPU
        old_rng = torch.get_rng_state()
        torch.manual_seed(seed)
        new = build_gpt(config, {}, "test")
        assert torch.equal(torch.get_rng_state(), old_rng)
        for mine, theirs in [
            (old.state_dict(), new.state_dict()),
            (old.named_buffers(), new.named_buffers()),
        ]:
            mine, theirs = dict(mine), dict(theirs)
            assert mine.keys() == theirs.keys()
            for key, tensor in mine.items():
                assert theirs[key].device.type == "cpu"
                assert torch.equal(tensor, theirs[key]), (name, seed, key)
        tied = new.head.weight is new.token_embedding.weight
        assert tied == config.tie_weights


def test_a_model_built_with_weights_holds_them_and_draws_nothing():
    """Weights given (a checkpoint's, a folder's): copied in place, no draw taken from torch's
    generator; weights of another shape or name are refused by name before anything is built."""
    from gptlab.model.meta import build_gpt

    config = small_config(tie_weights=True, attention="manual")
    torch.manual_seed(3)
    weights = {f"model.{k}": v for k, v in GPT(config).state_dict().items()}
    torch.manual_seed(0)
    before = torch.get_rng_state()
    model = build_gpt(config, weights, "ckpt_path: 'x.ckpt'")
    assert torch.equal(torch.get_rng_state(), before)
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[f"model.{key}"]), key
    assert model.head.weight is model.token_embedding.weight
    assert model.blocks[0].attn.mask.equal(torch.ones(16, 16, dtype=torch.bool).triu(diagonal=1))
    wrong = {**weights, "model.ln_f.weight": torch.ones(33)}
    with pytest.raises(ConfigError, match=r"x.ckpt' does not hold .*ln_f.weight has shape \[33\]"):
        build_gpt(config, wrong, "ckpt_path: 'x.ckpt'")
    del wrong["model.ln_f.weight"]
    with pytest.raises(ConfigError, match="ln_f.weight is missing"):
        build_gpt(config, wrong, "ckpt_path: 'x.ckpt'")
