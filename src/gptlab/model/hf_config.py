"""gptlab's GPT as a Hugging Face config.json, both ways: the class that holds a model's settings
(`model_type`), the config.json it writes, and what a config.json read back asks for, each of its
fields carried, irrelevant or refused by name (docs/export.md)."""

import dataclasses

import torch

from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig

ACTS = ("relu", "gelu", "gelu_new", "relu2")  # transformers' ACT2FN names for gptlab's own
TABLE = ("sinusoidal", "learned")  # a table added to the embeddings: a position embedding
ADDED = dict(norm_layer="layernorm", positional=TABLE, activation=ACTS, qk_norm=False)
ROTARY = dict(norm="pre", norm_layer="rmsnorm", positional="rope")
# model_type -> (its class, the settings it holds exactly); the first that holds a model wins
CLASSES = {
    "gpt2": ("GPT2LMHeadModel", dict(norm="pre", **ADDED)),
    "opt": ("OPTForCausalLM", dict(norm="post", **ADDED, norm_eps=(None, 1e-5))),  # eps fixed
    "llama": ("LlamaForCausalLM", dict(**ROTARY, activation="swiglu", qk_norm=False)),
    "qwen3": ("Qwen3ForCausalLM", dict(**ROTARY, activation="swiglu", qk_norm=True, bias=False)),
    "arcee": ("ArceeForCausalLM", dict(**ROTARY, activation=ACTS, qk_norm=False)),
    "apertus": ("ApertusForCausalLM", dict(**ROTARY, activation=ACTS, qk_norm=True, bias=False)),
}
NORM_EPS = {"layernorm": 1e-5, "rmsnorm": torch.finfo(torch.float32).eps}  # torch's, in fp32
ROPE = {"rope_type": "default"}  # position.Rotary's: pos / rope_theta^(2i / head_size)
# transformers' activations -> gptlab's; gelu_pytorch_tanh: gelu_new in torch's kernel
ACTIVATION = {**{a: a for a in ACTS}, "gelu_pytorch_tanh": "gelu_new"}
GATED = {"silu": "swiglu"}  # the Llama and Qwen3 FFN: down(act(gate) * up)
CARRIED = "carried"  # read into gptlab's settings (run/hf_folder.settings_of)
# Every field of the classes' configs (transformers' dataclasses): CARRIED; None, nothing gptlab's
# model computes (dropout, init, token ids, other tasks' heads, kernels of the same function); or
# the value gptlab computes (of the config `c`), any other refused by name
FIELDS = {
    **dict.fromkeys(("vocab_size", "tie_word_embeddings", "n_embd", "hidden_size"), CARRIED),
    **dict.fromkeys(("n_layer", "num_hidden_layers", "n_head", "num_attention_heads"), CARRIED),
    **dict.fromkeys(("n_positions", "max_position_embeddings", "do_layer_norm_before"), CARRIED),
    **dict.fromkeys(("n_inner", "ffn_dim", "intermediate_size", "mlp_bias", "hidden_act"), CARRIED),
    **dict.fromkeys(("activation_function", "layer_norm_epsilon", "rms_norm_eps"), CARRIED),
    **dict.fromkeys(("transformers_version", "architectures", "dtype", "return_dict"), None),
    **dict.fromkeys(("output_hidden_states", "id2label", "label2id", "problem_type"), None),
    **dict.fromkeys(("is_encoder_decoder", "chunk_size_feed_forward", "use_cache"), None),
    **dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id", "initializer_range"), None),
    **dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout", "layerdrop"), None),
    **dict.fromkeys(("summary_type", "summary_use_proj", "summary_activation"), None),
    **dict.fromkeys(("summary_proj_to_labels", "summary_first_dropout", "attention_dropout"), None),
    "reorder_and_upcast_attn": None,  # GPT-2's scores scaled before Q·Kᵀ, in fp32: the same
    **dict.fromkeys(("init_std", "pretraining_tp"), None),  # OPT's init; unread by Llama
    **dict.fromkeys(("sliding_window", "max_window_layers"), None),  # read with the two below
    "use_sliding_window": False,
    "layer_types": lambda c: ["full_attention"] * c.num_hidden_layers,
    **dict.fromkeys(("scale_attn_weights", "enable_bias", "layer_norm_elementwise_affine"), True),
    **dict.fromkeys(("scale_attn_by_inverse_layer_idx", "add_cross_attention"), False),
    "_remove_final_layer_norm": False,
    "word_embed_proj_dim": lambda c: c.hidden_size,
    "num_key_value_heads": lambda c: c.num_attention_heads,  # no grouped-query attention
    "head_dim": lambda c: c.hidden_size // c.num_attention_heads,
    "attention_bias": lambda c: getattr(c, "mlp_bias", False),  # one model.bias for both
    "rope_parameters": lambda c: dict(ROPE, rope_theta=c.rope_parameters.get("rope_theta")),
}


def holds(config: GPTConfig, settings: dict) -> list[str]:
    """The settings of `config` a class does not hold (empty: it holds the model exactly)."""
    refused = [f"model.logit_softcap={config.logit_softcap}"] if config.logit_softcap else []
    for key, allowed in settings.items():
        allowed = allowed if isinstance(allowed, tuple) else (allowed,)
        if getattr(config, key) not in allowed:
            refused.append(f"model.{key}={getattr(config, key)}")
    return refused


def model_type(config: GPTConfig) -> str:
    """The first class that holds the model exactly, or one paragraph naming what each lacks."""
    tried = {}
    for kind, (name, settings) in CLASSES.items():
        tried[name] = holds(config, settings)
        if not tried[name]:
            return kind
    lacks = "; ".join(f"{name} not {', '.join(refused)}" for name, refused in tried.items())
    raise ConfigError(
        f"No Hugging Face class computes this model exactly, so it is not exported. Tried: "
        f"{lacks}. Train with settings one of them holds (docs/export.md lists them)."
    )


def hf_config(config: GPTConfig, eos_token_id: int | None) -> dict:
    """config.json's settings (model_type first) of the class that holds `config`."""
    kind, eps = model_type(config), config.norm_eps or NORM_EPS[config.norm_layer]
    common = dict(vocab_size=config.vocab_size, tie_word_embeddings=config.tie_weights)
    common.update(bos_token_id=eos_token_id, eos_token_id=eos_token_id)
    if kind == "gpt2":
        sizes = dict(n_positions=config.context_length, n_embd=config.d_model)
        sizes.update(n_layer=config.num_blocks, n_head=config.num_heads)
        dropout = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        act = dict(n_inner=config.ffn_hidden, activation_function=config.activation)
        return dict(model_type=kind, **common, **sizes, **dropout, **act, layer_norm_epsilon=eps)
    sizes = dict(hidden_size=config.d_model, num_hidden_layers=config.num_blocks)
    sizes.update(
        num_attention_heads=config.num_heads, max_position_embeddings=config.context_length
    )
    if kind == "opt":
        layout = dict(do_layer_norm_before=False, word_embed_proj_dim=config.d_model)
        ffn = dict(ffn_dim=config.ffn_hidden, activation_function=config.activation)
        return dict(
            model_type=kind, **common, **sizes, **layout, **ffn, dropout=0.0, pad_token_id=None
        )
    heads = dict(num_key_value_heads=config.num_heads, head_dim=config.head_size)
    act = "silu" if config.activation == "swiglu" else config.activation
    ffn = dict(intermediate_size=config.ffn_hidden, hidden_act=act, mlp_bias=config.bias)
    rope = dict(rope_parameters=dict(ROPE, rope_theta=config.rope_theta), rms_norm_eps=eps)
    rope.update(attention_bias=config.bias)
    return dict(model_type=kind, **common, **sizes, **heads, **ffn, **rope)


def settings_of(c) -> tuple[dict, list[str], tuple[str, int]]:
    """(GPTConfig settings, each field of the transformers config `c` whose value gptlab does not
    compute named by FIELDS, the field and width of its FFN)."""
    kind, d_model, heads = c.model_type, c.hidden_size, c.num_attention_heads
    differ = []
    for field in dataclasses.fields(c):
        value, rule = getattr(c, field.name), FIELDS.get(field.name, "unknown")
        want = rule(c) if callable(rule) else rule
        if rule == "unknown":
            differ.append(f"{field.name}={value!r}, a setting gptlab does not know")
        elif rule not in (CARRIED, None) and value != want:
            differ.append(f"{field.name}={value!r} (gptlab computes {want!r})")
    if kind in ("gpt2", "opt"):
        width = ("n_inner", c.n_inner or 4 * d_model) if kind == "gpt2" else ("ffn_dim", c.ffn_dim)
        act, eps = "activation_function", getattr(c, "layer_norm_epsilon", NORM_EPS["layernorm"])
        norm = "pre" if getattr(c, "do_layer_norm_before", True) else "post"
        layout = dict(norm=norm, norm_layer="layernorm", positional="learned")
    else:  # the Llama family: gated (llama, qwen3) or not (arcee, apertus)
        width, act, eps = ("intermediate_size", c.intermediate_size), "hidden_act", c.rms_norm_eps
        layout = dict(norm="pre", norm_layer="rmsnorm", positional="rope")
        layout.update(bias=getattr(c, "mlp_bias", False), qk_norm=kind in ("qwen3", "apertus"))
        layout.update(rope_theta=c.rope_parameters.get("rope_theta"))
    names = GATED if kind in ("llama", "qwen3") else ACTIVATION
    activation = names.get(getattr(c, act))
    if activation is None:
        differ.append(f"{act}={getattr(c, act)!r} (gptlab computes one of {', '.join(names)})")
    layout.update(norm_eps=None if eps == NORM_EPS[layout["norm_layer"]] else eps)
    per = 1.5 if activation == "swiglu" else 1.0  # SwiGLU's width: 2/3 of ffn_mult * d_model
    sizes = dict(d_model=d_model, num_heads=heads, num_blocks=c.num_hidden_layers)
    sizes.update(context_length=c.max_position_embeddings, ffn_mult=round(per * width[1] / d_model))
    common = dict(vocab_size=c.vocab_size, tie_weights=c.tie_word_embeddings)
    return dict(**common, **sizes, **layout, activation=activation), differ, width
