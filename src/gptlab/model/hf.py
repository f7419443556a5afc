"""gptlab's GPT as the Hugging Face class that computes the same function (docs/export.md): the
class chosen by the architecture settings, its config.json, and the weights renamed both ways.
Plain torch: `transformers` is the caller's."""

import dataclasses
import math
import re

import torch
from torch import Tensor

from gptlab.errors import ConfigError
from gptlab.model import mup
from gptlab.model.config import GPTConfig
from gptlab.model.position import SinusoidalEncoding

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
# gptlab module -> the class's ({i}: a block); a tuple: Wq, Wk, Wv split into three
GPT2 = {
    "token_embedding": "transformer.wte",
    "position_embedding": "transformer.wpe",
    "blocks.{i}.ln1": "transformer.h.{i}.ln_1",
    "blocks.{i}.attn.qkv": "transformer.h.{i}.attn.c_attn",
    "blocks.{i}.attn.proj": "transformer.h.{i}.attn.c_proj",
    "blocks.{i}.ln2": "transformer.h.{i}.ln_2",
    "blocks.{i}.ffn.up": "transformer.h.{i}.mlp.c_fc",
    "blocks.{i}.ffn.down": "transformer.h.{i}.mlp.c_proj",
    "ln_f": "transformer.ln_f",
    "head": "lm_head",
}
OPT = {
    "token_embedding": "model.decoder.embed_tokens",
    "position_embedding": "model.decoder.embed_positions",
    "blocks.{i}.ln1": "model.decoder.layers.{i}.self_attn_layer_norm",
    "blocks.{i}.attn.qkv": tuple(f"model.decoder.layers.{{i}}.self_attn.{x}_proj" for x in "qkv"),
    "blocks.{i}.attn.proj": "model.decoder.layers.{i}.self_attn.out_proj",
    "blocks.{i}.ln2": "model.decoder.layers.{i}.final_layer_norm",
    "blocks.{i}.ffn.up": "model.decoder.layers.{i}.fc1",
    "blocks.{i}.ffn.down": "model.decoder.layers.{i}.fc2",
    "ln_f": "model.decoder.final_layer_norm",
    "head": "lm_head",
}
LLAMA = {
    "token_embedding": "model.embed_tokens",
    "blocks.{i}.ln1": "model.layers.{i}.input_layernorm",
    "blocks.{i}.attn.qkv": tuple(f"model.layers.{{i}}.self_attn.{x}_proj" for x in "qkv"),
    "blocks.{i}.attn.proj": "model.layers.{i}.self_attn.o_proj",
    "blocks.{i}.attn.q_norm": "model.layers.{i}.self_attn.q_norm",
    "blocks.{i}.attn.k_norm": "model.layers.{i}.self_attn.k_norm",
    "blocks.{i}.ln2": "model.layers.{i}.post_attention_layernorm",
    "blocks.{i}.ffn.gate": "model.layers.{i}.mlp.gate_proj",
    "blocks.{i}.ffn.up": "model.layers.{i}.mlp.up_proj",
    "blocks.{i}.ffn.down": "model.layers.{i}.mlp.down_proj",
    "ln_f": "model.norm",
    "head": "lm_head",
}
APERTUS = {
    **LLAMA,
    "blocks.{i}.ln1": "model.layers.{i}.attention_layernorm",
    "blocks.{i}.ln2": "model.layers.{i}.feedforward_layernorm",
}
NAMES = {
    "gpt2": GPT2,
    "opt": OPT,
    "llama": LLAMA,
    "qwen3": LLAMA,
    "arcee": LLAMA,
    "apertus": APERTUS,
}
OPT_OFFSET = 2  # OPT's position table starts two rows late (its padding convention)
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


def rope_order(t: Tensor, head_size: int, inverse: bool = False) -> Tensor:
    """Rows of each head from gptlab's RoPE pairs (2i, 2i+1) to rotate_half's (i, i + head_size/2),
    the convention of the Llama family; `inverse` goes back. Scores are unchanged: Q and K both."""
    pairs = (-1, head_size // 2, 2) if not inverse else (-1, 2, head_size // 2)
    return t.reshape(*pairs, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def counterparts(kind: str, module: str) -> tuple[str, list[str], list[bool]]:
    """(the block number or "", the class's names of gptlab's `module` (Wq, Wk, Wv: three), and
    whether each one's rows are RoPE pairs: Wq, Wk and the QK-norm gains of the Llama family)."""
    for pattern, other in NAMES[kind].items():
        found = re.fullmatch(re.escape(pattern).replace(r"\{i\}", r"(\d+)"), module)
        if found:
            block = found.group(1) if found.groups() else ""
            names = other if isinstance(other, tuple) else (other,)
            rope = kind not in ("gpt2", "opt")
            rotated = [
                rope and (module.endswith(("q_norm", "k_norm")) or len(names) == 3 and i < 2)
                for i in range(len(names))
            ]
            return block, [name.format(i=block) for name in names], rotated
    raise KeyError(module)


def final_norm(config: GPTConfig) -> str:
    """The norm whose output the head reads: ln_f (pre-LN), the last block's ln2 (post-LN)."""
    return "ln_f" if config.norm == "pre" else f"blocks.{config.num_blocks - 1}.ln2"


def folded(config: GPTConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """gptlab's multipliers (mup.scales: the article's sqrt(d_model), μP's) folded into weights,
    as no class has them: the embedding's into the token embedding; the output's into the head
    (tied: into the final norm, with 1/embedding's, as the head reads the scaled embedding); the
    residual's into each branch's last projection; the attention scale, over the class's own
    1/sqrt(head_size), into the queries (QK-norm: its gain). Exact up to fp32 rounding."""
    s = mup.scales(config)
    state = dict(state)
    state["token_embedding.weight"] = state["token_embedding.weight"] * s.embedding
    if config.tie_weights:
        for key in [k for k in state if k.startswith(final_norm(config) + ".")]:
            state[key] = state[key] / s.embedding * s.output
        state["head.weight"] = state["token_embedding.weight"]
    else:
        state["head.weight"] = state["head.weight"] * s.output
    query = s.attention * math.sqrt(config.head_size) if s.attention else 1.0
    queries = ("attn.q_norm.weight",) if config.qk_norm else ("attn.qkv.weight", "attn.qkv.bias")
    for key in list(state):
        if key.endswith(("attn.proj.weight", "attn.proj.bias", "ffn.down.weight", "ffn.down.bias")):
            state[key] = state[key] * s.residual
        elif key.endswith(queries):  # Wq: qkv's first d_model rows
            t = state[key]
            state[key] = torch.cat([t[: config.d_model] * query, t[config.d_model :]])
    return state


def to_hf(config: GPTConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """gptlab's weights (no `model.` prefix) -> the class's, multipliers folded in. Tables gptlab
    computes are written; biases gptlab has none of are zeros."""
    kind, state = model_type(config), folded(config, state)
    if config.positional == "sinusoidal":
        state["position_embedding.weight"] = SinusoidalEncoding(config).table
    if kind == "opt":
        table = state["position_embedding.weight"]
        state["position_embedding.weight"] = torch.cat(
            [table.new_zeros(OPT_OFFSET, table.shape[1]), table]
        )
    out = {}
    for key, tensor in state.items():
        module, leaf = key.rsplit(".", 1)
        if kind in ("gpt2", "opt") and leaf == "weight" and f"{module}.bias" not in state:
            if module not in ("token_embedding", "position_embedding", "head"):
                out.update(
                    rename(kind, config, f"{module}.bias", tensor.new_zeros(tensor.shape[0]))
                )
        out.update(rename(kind, config, key, tensor))
    return out


def rename(kind: str, config: GPTConfig, key: str, tensor: Tensor) -> dict[str, Tensor]:
    """One gptlab tensor as the class's: renamed, split (Wq, Wk, Wv), transposed (GPT-2's Conv1D),
    its RoPE rows reordered (the Llama family)."""
    module, leaf = key.rsplit(".", 1)
    block, names, rotated = counterparts(kind, module)
    if kind == "gpt2" and tensor.dim() == 2 and block:
        tensor = tensor.t()
    parts = tensor.chunk(len(names))
    return {
        f"{name}.{leaf}": (rope_order(part, config.head_size) if turned else part).contiguous()
        for name, part, turned in zip(names, parts, rotated, strict=True)
    }


def unscaled(wte: Tensor, scale: float) -> Tensor:
    """The token embedding E with E * scale == wte in fp32 wherever one exists (the nearest
    neighbours of wte / scale tried): gptlab's embedding then computes wte bit for bit."""
    e = wte / scale
    for _ in range(2):
        e = torch.where(e * scale > wte, torch.nextafter(e, torch.full_like(e, -math.inf)), e)
        e = torch.where(e * scale < wte, torch.nextafter(e, torch.full_like(e, math.inf)), e)
    return e


def gptlab_keys(kind: str, config: GPTConfig, hf: dict[str, Tensor]) -> list[str]:
    """gptlab's names of the tensors `hf` holds: the class's names (NAMES) read backwards."""
    keys = []
    for pattern, other in NAMES[kind].items():
        first = other[0] if isinstance(other, tuple) else other
        for i in range(config.num_blocks) if "{i}" in pattern else [""]:
            found = [leaf for leaf in ("weight", "bias") if f"{first.format(i=i)}.{leaf}" in hf]
            keys += [f"{pattern.format(i=i)}.{leaf}" for leaf in found]
    return keys


def class_names(kind: str, hf: dict[str, Tensor]) -> dict[str, Tensor]:
    """`hf` under the class's names: a base model's file (the Hub's GPT-2: h.0..., wte) lacks the
    prefix (transformers' base_model_prefix) that transformers adds when it loads one."""
    base = NAMES[kind]["token_embedding"].split(".")[0] + "."
    if any(key.startswith(base) for key in hf):
        return hf
    return {base + key: tensor for key, tensor in hf.items()}


def from_hf(kind: str, config: GPTConfig, hf: dict[str, Tensor]) -> tuple[dict, dict]:
    """The class's weights -> (gptlab's settings, its weights under `model.`): to_hf undone, and
    gptlab's own settings read back (a sinusoidal table, biases that are all zero)."""
    scale, hf = math.sqrt(config.d_model), class_names(kind, hf)
    state = {}
    for key in gptlab_keys(kind, config, hf):
        module, leaf = key.rsplit(".", 1)
        block, names, rotated = counterparts(kind, module)
        parts = [hf[f"{name}.{leaf}"] for name in names]
        parts = [
            rope_order(part, config.head_size, inverse=True) if turned else part
            for part, turned in zip(parts, rotated, strict=True)
        ]
        tensor = torch.cat(parts) if len(parts) > 1 else parts[0]
        if kind == "gpt2" and tensor.dim() == 2 and block:
            tensor = tensor.t()
        state[key] = tensor.contiguous()
    if kind == "opt" and "position_embedding.weight" in state:
        state["position_embedding.weight"] = state["position_embedding.weight"][OPT_OFFSET:]
    state["token_embedding.weight"] = unscaled(state["token_embedding.weight"], scale)
    if config.tie_weights:
        for key in [k for k in state if k.startswith(final_norm(config) + ".")]:
            state[key] = state[key] * scale
        state["head.weight"] = state["token_embedding.weight"]
    settings = dataclasses.asdict(config)
    table = state.get("position_embedding.weight")
    if table is not None and torch.equal(table, SinusoidalEncoding(config).table):
        settings["positional"] = "sinusoidal"
        del state["position_embedding.weight"]
    biases = [k for k in state if k.endswith(".bias")]
    if config.norm_layer == "layernorm" and biases and not any(state[k].any() for k in biases):
        settings["bias"] = False
        state = {k: v for k, v in state.items() if k not in biases}
    return settings, {f"model.{k}": v for k, v in state.items()}


def settings_of(c) -> tuple[dict, list[str], tuple[str, int]]:
    """(GPTConfig settings, each field of the transformers config `c` whose value gptlab does not
    compute named by model.hf.FIELDS, the field and width of its FFN)."""
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
