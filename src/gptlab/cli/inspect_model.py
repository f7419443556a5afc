"""gptlab-inspect [ckpt_path=<run dir>]: the model the way the seed articles draw it (without
ckpt_path: the article's, random weights); a run dir's figures also go to its TensorBoard."""

import logging
import math
from pathlib import Path
from typing import NamedTuple

import hydra
import numpy as np
import torch
from omegaconf import DictConfig

from gptlab.cli import inspect_figures as draw
from gptlab.cli.app import run_hydra_app, run_task
from gptlab.cli.coord_check import run_coord_check
from gptlab.config.resolve import resolved
from gptlab.config.schemas import register_configs
from gptlab.data.tokenizer import Tokenizer
from gptlab.errors import ConfigError, check_whole_number
from gptlab.model.gpt import GPT, GPTConfig
from gptlab.model.meta import build_gpt
from gptlab.run import directory
from gptlab.run.checkpoints import find_checkpoint, load_model
from gptlab.run.place import PLACE

log = logging.getLogger("gptlab.inspect")
register_configs()  # the unique_dir resolver of the run directory


class Step(NamedTuple):
    """One step of the forward pass, as the seed articles draw it."""

    label: str
    shape: list[int]
    meaning: str


# the shapes the articles write beside the steps
EMBEDDED = "[batch, context_length, d_model]"
HEADS = "[batch, num_heads, context_length, head_size]"
SCORES = "[batch, num_heads, context_length, context_length]"
FFN_HIDDEN = "[batch, context_length, ffn_mult * d_model]"
LOGITS = "[batch, context_length, vocab_size]"


def record_forward(model: GPT, ids: torch.Tensor) -> tuple[dict, dict]:
    """The model's own forward on ids, hooked: each module's first input and its output."""
    inputs, outputs = {}, {}

    def remember(module, args, output):  # removed on leaving the `with`
        inputs[module] = args[0]
        outputs[module] = output

    with torch.nn.modules.module.register_module_forward_hook(remember), torch.no_grad():
        model(ids)
    return inputs, outputs


def trace_forward(model: GPT, ids: torch.Tensor, block: int = 0) -> tuple[list[Step], dict]:
    """The real shapes of the model's own forward on ids [batch, T] (in eval mode). The block's
    attention, which sdpa fuses, is recomputed the articles' way from its Q, K (after QK-norm and
    RoPE) and V; the tests check that this rebuilds what the block merged."""
    if not 0 <= block < len(model.blocks):
        raise ConfigError(
            f"block={block}: the model has {len(model.blocks)} block(s); choose 0 to "
            f"{len(model.blocks) - 1}."
        )
    ins, outs = record_forward(model, ids)
    chosen = model.blocks[block]
    attn = chosen.attn
    q, k, v = outs[attn.qkv].chunk(3, dim=2)  # each [batch, T, d_model]
    qh = attn.rotary(outs[attn.q_norm])  # [batch, num_heads, T, head_size]: as attention uses it
    kh = attn.rotary(outs[attn.k_norm])
    vh = v.unflatten(2, (qh.shape[1], qh.shape[3])).transpose(1, 2)  # split into heads alike
    scale = attn.scale or 1 / math.sqrt(qh.shape[3])  # μP's 1/head_size or the article's
    scores = qh @ kh.transpose(-2, -1) * scale  # [batch, num_heads, T, T]
    future = torch.ones_like(scores[0, 0], dtype=torch.bool).triu(diagonal=1)
    masked = scores.masked_fill(future, float("-inf"))
    softmax = torch.softmax(masked, dim=-1)
    trace = {
        "q": q,
        "k": k,
        "v": v,
        "heads": qh,
        "scores": scores,
        "masked": masked,
        "softmax": softmax,
        "weighted": softmax @ vh,
        "merged": ins[attn.proj],
        "wo": outs[attn.proj],
    }

    config = model.config
    pre = config.norm == "pre"
    at = f"block {block}:"
    sinusoidal = config.positional == "sinusoidal"
    positional = "+ positional encoding" if sinusoidal else "+ position embedding"
    embedded = outs[model.token_embedding]
    add_norm = f"{at} residual + LayerNorm"
    rows = [  # (shown, label, tensor, meaning)
        (True, "ids", ids, "token ids: [batch, context_length]"),
        (True, "token embedding", embedded, f"{EMBEDDED}, scaled by sqrt(d_model)"),
        (True, positional, ins[model.dropout], EMBEDDED),
        (pre, f"{at} LayerNorm", outs[chosen.ln1], EMBEDDED),
        (True, f"{at} Q, K, V (each)", q, f"{EMBEDDED}: x.Wq, x.Wk, x.Wv"),
        (True, f"{at} heads (Q; K, V alike)", qh, HEADS),
        (True, f"{at} scores Q.K^T/sqrt(head_size)", scores, SCORES),
        (True, f"{at} mask (-inf above diagonal)", masked, "the future is hidden"),
        (True, f"{at} softmax", softmax, "attention weights; each row sums to 1"),
        (True, f"{at} weighted sum (weights.V)", trace["weighted"], HEADS),
        (True, f"{at} merged heads", ins[attn.proj], EMBEDDED),
        (True, f"{at} Wo", outs[attn.proj], f"{EMBEDDED}: the output projection"),
        (not pre, add_norm, outs[chosen.ln1], "Add & Norm: LayerNorm(x + attention)"),
        (pre, f"{at} residual", ins[chosen.ln2], "x + attention"),
        (pre, f"{at} LayerNorm", outs[chosen.ln2], EMBEDDED),
        (True, f"{at} FFN hidden (ReLU)", outs[chosen.ffn.up], FFN_HIDDEN),
        (True, f"{at} FFN", outs[chosen.ffn], EMBEDDED),
        (not pre, add_norm, outs[chosen.ln2], "Add & Norm: LayerNorm(x + FFN)"),
        (pre, f"{at} residual", outs[chosen], "x + FFN"),
        (config.num_blocks > 1, f"... x {config.num_blocks} blocks", outs[chosen], EMBEDDED),
        (pre, "final LayerNorm", outs[model.ln_f], EMBEDDED),
        (True, "logits", outs[model.head], LOGITS),
    ]
    steps = [Step(label, list(t.shape), meaning) for shown, label, t, meaning in rows if shown]
    return steps, trace


def inspect_model(
    model: GPT, tokenizer: Tokenizer, prompt: str, batch_size: int = 4, block: int = 0
) -> tuple[list[Step], dict, list[str]]:
    """trace_forward on `batch_size` windows of the prompt, evenly spread, not at random."""
    check_whole_number({"batch_size": batch_size}, "batch_size", 1, "the number of prompt windows")
    prompt_ids = tokenizer.encode_prompt(prompt)
    length = min(model.config.context_length, len(prompt_ids))  # all of a short prompt
    starts = np.linspace(0, len(prompt_ids) - length, batch_size).round().astype(int)
    ids = torch.tensor([prompt_ids[s : s + length] for s in starts])  # [batch, length]
    steps, trace = trace_forward(model, ids.to(next(model.parameters()).device), block)
    tokens = [tokenizer.decode([i]).translate(draw.AXIS_LABEL) for i in ids[0].tolist()]
    return steps, {name: t.cpu() for name, t in trace.items()}, tokens


def random_model(
    settings: dict | DictConfig,
    prompt: str,
    encoding: str = "cl100k_base",
    compact_vocab: bool = True,
    seed: int = 0,
) -> tuple[GPT, Tokenizer]:
    """The articles' model with random weights (GPT(config)'s for the seed), bounded before it
    is built as a file's model is; compact_vocab: the prompt's tokens only."""
    prompt_ids = Tokenizer(encoding).encode_tiktoken(str(prompt or "\n"))
    tokenizer = Tokenizer.fit(encoding, prompt_ids, compact_vocab)
    try:
        config = GPTConfig(**{**settings, "vocab_size": tokenizer.vocab_size})
    except TypeError as e:  # a key GPTConfig does not have
        raise ConfigError(
            f"model: {e}; the keys are those of gptlab.model.config.GPTConfig."
        ) from None
    torch.manual_seed(seed)
    return build_gpt(config, {}, "model").eval(), tokenizer


def look_inside(cfg: DictConfig) -> None:
    """Build or load the model, print the steps, write the figures (also to a run's TensorBoard)."""
    cfg = resolved(cfg)
    out_dir = Path(cfg.output_dir)  # made and checked before Hydra wrote (run/admission.py)
    if cfg.coord_check:
        run_coord_check(cfg, out_dir)
        return
    check_whole_number(cfg, "block", 0, "the block whose attention is drawn")
    if cfg.ckpt_path:
        path = find_checkpoint(cfg.ckpt_path)
        model, tokenizer, step = load_model(path)
        log.info("Model from %s (step %d)", path, step)
    else:
        model, tokenizer = random_model(
            cfg.model, cfg.prompt, cfg.encoding, cfg.compact_vocab, cfg.seed
        )
        log.info("A model with random weights (seed %d): no ckpt_path given", cfg.seed)
    steps, trace, tokens = inspect_model(model, tokenizer, cfg.prompt, cfg.batch_size, cfg.block)

    config = model.config
    batch, length = steps[0].shape  # steps[0]: the ids
    print(
        f"GPT: d_model {config.d_model}, {config.num_heads} heads of {config.head_size}, "
        f"{config.num_blocks} block(s), {config.norm}-LN, vocab {config.vocab_size}; "
        f"{batch} window(s) of {length} prompt tokens"
    )
    for traced in steps:
        print(f"{traced.label:<38} {str(traced.shape):<18} {traced.meaning}", flush=True)

    figures = {"positional_encoding": draw.positional_figure(model)}
    for name in draw.ATTENTION_FIGURES:
        figure = draw.attention_figure(trace, tokens, name, cfg.block)
        figures[f"attention_block{cfg.block}_{name}"] = figure
    for stem, fig in figures.items():  # tight: long token labels stay whole
        PLACE.save_figure(fig, out_dir / f"{stem}.png", dpi=100, bbox_inches="tight")
    log.info("Figures:\n%s", "\n".join(f"  {out_dir / stem}.png" for stem in figures))
    if cfg.ckpt_path and Path(cfg.ckpt_path).is_dir() and cfg.tensorboard:
        write_to_run(cfg.ckpt_path, figures, step)


def write_to_run(run_dir: str, figures: dict, step: int) -> None:
    """The figures beside an own run's curves (TensorBoard's IMAGES tab); others' stay unwritten."""
    from torch.utils.tensorboard import SummaryWriter

    try:
        PLACE.admit(run_dir, "ckpt_path", own=True)
    except ConfigError:
        log.info("Not writing to '%s': not a run directory of yours", run_dir)
        return
    with SummaryWriter(log_dir=str(directory.tensorboard_run(run_dir))) as writer:
        for stem, fig in figures.items():
            writer.add_figure(f"inspect/{stem}", fig, global_step=step)
    log.info("Also in TensorBoard (IMAGES tab, inspect/*): tensorboard --logdir %s", run_dir)


@hydra.main(version_base="1.3", config_path="pkg://gptlab.conf", config_name="inspect")
def run_job(cfg: DictConfig) -> None:  # tests pass it a composed cfg
    run_task(look_inside, cfg, log)


def main() -> None:  # the console script gptlab-inspect
    run_hydra_app(run_job, "gptlab-inspect")


if __name__ == "__main__":
    main()
