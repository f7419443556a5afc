"""gptlab's GPT as the Hugging Face class that computes the same function (docs/export.md): the
weights renamed both ways, gptlab's multipliers folded in (the class and its config.json:
model/hf_config.py). Plain torch: `transformers` is the caller's."""

import dataclasses
import math
import re

import torch
from torch import Tensor

from gptlab.model import mup
from gptlab.model.config import GPTConfig
from gptlab.model.hf_config import model_type
from gptlab.model.position import SinusoidalEncoding

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
                rope and (module.endswith(("q_norm", "k_norm")) or (len(names) == 3 and i < 2))
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
        blocks = [""]  # a pattern outside the blocks: once
        if "{i}" in pattern:
            blocks = range(config.num_blocks)
        for i in blocks:
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
    gptlab's own settings read back (a sinusoidal table). The architecture is the config's and
    the tensors the file holds, never their values: biases transformers initialised to zero (or
    an export wrote for `bias=false`) are biases a fine-tune trains."""
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
    if kind in ("gpt2", "opt"):  # biases whichever tensors the file holds, zero or not: trained
        settings["bias"] = any(key.endswith(".bias") for key in state)
    return settings, {f"model.{k}": v for k, v in state.items()}
