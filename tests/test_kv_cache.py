"""The KV cache (model/cache.py): under greedy decoding, GPT.generate gives the same tokens with
and without it, for every toggle, a batch of prompts, and past context_length (a slid window);
its logits are the full forward's; and it really runs one token at a time until the window is
full. Small random-init models built in-process, in float64 so that no near-tie of two logits
can flip an argmax between two correct computations."""

from __future__ import annotations

import pytest
import torch

from gptlab.model.cache import KVCache
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT

CONTEXT = 16
TOGGLES = [
    {"positional": positional, "attention": attention}
    for positional in ("sinusoidal", "learned", "rope")
    for attention in ("sdpa", "manual")
] + [
    {"qk_norm": True},
    {"norm": "post"},
    {"norm_layer": "rmsnorm", "bias": False},
    {"activation": "gelu"},
    {"activation": "relu2"},
    {"activation": "swiglu"},
    {"tie_weights": True},
    {"logit_softcap": 2.0},
    {"positional": "rope", "qk_norm": True, "activation": "relu2", "norm_layer": "rmsnorm"},
]


def small_model(seed: int = 0, **toggles) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=97,
        context_length=CONTEXT,
        d_model=32,
        num_heads=4,
        num_blocks=2,
        dropout=0.0,
        **toggles,
    )
    model = GPT(config).double().eval()
    with torch.no_grad():  # blocks' weights larger than the init's: varied tokens
        for p in model.blocks.parameters():
            p.mul_(4.0)
    return model


@pytest.mark.parametrize(
    "toggles", TOGGLES, ids=lambda t: ",".join(f"{k}={v}" for k, v in t.items())
)
def test_greedy_tokens_with_the_cache_equal_those_without(toggles):
    model = small_model(**toggles)
    prompts = torch.randint(0, 97, (3, 5), generator=torch.Generator().manual_seed(1))
    new = 2 * CONTEXT + 3  # the window slides for more than a window's length
    cached = model.generate(prompts, new, temperature=0, use_cache=True)
    uncached = model.generate(prompts, new, temperature=0, use_cache=False)
    assert cached.shape == (3, 5 + new)
    assert torch.equal(cached, uncached)
    assert len(set(cached[:, 5:].flatten().tolist())) > 1  # not one token everywhere


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
def test_cached_logits_are_the_full_forwards(positional):
    """Prompt, then one token at a time: each position's logits as the whole sequence gives
    them at once (float32), so each new token sits at the cache's length."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=97, context_length=CONTEXT, d_model=32, positional=positional)
    model = GPT(config).eval()  # eval: no dropout
    ids = torch.randint(0, 97, (2, CONTEXT))
    full = model(ids)  # [2, CONTEXT, 97]
    cache = [KVCache(CONTEXT) for _ in model.blocks]
    with torch.no_grad():
        steps = [model(ids[:, :6], cache)]
        steps += [model(ids[:, t : t + 1], cache) for t in range(6, CONTEXT)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert [c.length for c in cache] == [CONTEXT] * len(model.blocks)


def test_the_cache_runs_one_token_a_step_until_the_window_is_full():
    model = small_model()
    lengths = []
    model.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
    list(model.generate_stream(torch.zeros(1, 5, dtype=torch.long), 20, temperature=0))
    # the prompt; 11 single tokens fill the window; from then on the slid window each step
    assert lengths == [5] + [1] * (CONTEXT - 5) + [CONTEXT] * (20 - 1 - (CONTEXT - 5))
    lengths.clear()
    list(model.generate_stream(torch.zeros(1, 5, dtype=torch.long), 4, 0, use_cache=False))
    assert lengths == [5, 6, 7, 8]


def test_a_cache_refuses_several_new_tokens_and_more_than_the_window():
    model = small_model()
    cache = [KVCache(CONTEXT) for _ in model.blocks]
    with torch.no_grad():
        model(torch.zeros(1, 10, dtype=torch.long), cache)
        with pytest.raises(ValueError, match="one token at a time"):
            model(torch.zeros(1, 2, dtype=torch.long), cache)
        for _ in range(CONTEXT - 10):
            model(torch.zeros(1, 1, dtype=torch.long), cache)
        with pytest.raises(ValueError, match="exceeds context_length"):
            model(torch.zeros(1, 1, dtype=torch.long), cache)
