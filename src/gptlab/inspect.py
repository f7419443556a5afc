"""gptlab-inspect: look inside the model the way the seed articles draw it.

    gptlab-inspect                                   # the article's model, random weights
    gptlab-inspect ckpt_path=outputs/<date>/<time>   # a trained one; figures also to TensorBoard

One real forward pass over windows of the prompt prints every step's tensor shape in the
articles' order (ids -> embeddings -> + positional encoding -> Q/K/V -> heads -> scores ->
mask -> softmax -> weighted sum -> merged -> Wo -> residual/LayerNorm -> FFN -> logits) and
draws the positional encoding and one block's attention, before the mask, after it and after
softmax, one panel per head. Forward hooks catch each step's tensors; the attention steps are
recomputed the article's way from the block's Q, K and V.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
import numpy as np
import torch
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf

from gptlab.config import register_configs
from gptlab.data.tokenizer import Tokenizer
from gptlab.errors import ConfigError, check_whole_number, main_or_exit, run_or_exit
from gptlab.model.gpt import GPT, GPTConfig

log = logging.getLogger("gptlab.inspect")
register_configs()  # the unique_dir resolver of the run directory
ATTENTION_FIGURES = {
    "scores": "attention scores Q·Kᵀ/√head_size, before the mask",
    "masked": "after the causal mask (-inf above the diagonal, grey)",
    "softmax": "after softmax: the attention weights (each row sums to 1)",
}


@dataclass
class Step:
    label: str  # the step, as the articles name it
    shape: list[int]
    meaning: str  # what the dimensions are

    def line(self) -> str:
        return f"{self.label:<38} {str(self.shape):<18} {self.meaning}"


@dataclass
class Inspection:
    """One traced forward pass: its steps in order and the chosen block's attention tensors."""

    config: GPTConfig
    block: int
    ids: torch.Tensor  # [batch, context_length]
    tokens: list[str]  # the first window's tokens, the figures' axis labels
    steps: list[Step]
    trace: dict[str, torch.Tensor]  # q, k, v, heads, scores, masked, softmax, weighted, merged, wo
    positional: torch.Tensor  # [context_length, d_model]: the sinusoidal table or learned rows


# ---------------------------------------------------------------- the forward pass
def prompt_windows(ids: list[int], batch_size: int, context_length: int) -> torch.Tensor:
    """`batch_size` windows of the prompt, as evenly spread as its length allows (the articles
    take random windows of the text); each holds context_length tokens, or all of a short prompt."""
    length = min(context_length, len(ids))
    starts = np.linspace(0, len(ids) - length, batch_size).round().astype(int)
    return torch.tensor([ids[s : s + length] for s in starts])  # [batch, length]


def trace_forward(model: GPT, ids: torch.Tensor, block: int = 0) -> tuple[list[Step], dict]:
    """Run the model's own forward on ids [batch, T], recording every step's shape with forward
    hooks; the chosen block's attention steps are recomputed the article's way from its Q, K, V
    (the same numbers an sdpa model's fused kernel computes)."""
    if not 0 <= block < len(model.blocks):
        raise ConfigError(f"block={block}: the model has {len(model.blocks)} block(s); choose 0 to "
                          f"{len(model.blocks) - 1}.")
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(name: str):
        def hook(module, inputs, output):
            seen[name] = (inputs[0].detach(), output.detach())
        return hook

    chosen = model.blocks[block]
    watched = {"embedding": model.token_embedding, "embed_dropout": model.dropout, "ln1": chosen.ln1,
               "ln2": chosen.ln2, "ffn_up": chosen.ffn.up, "ffn": chosen.ffn, "block": chosen,
               "ln_f": model.ln_f, "head": model.head, "qkv": chosen.attn.qkv, "wo": chosen.attn.proj}
    handles = [module.register_forward_hook(keep(name)) for name, module in watched.items()]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(ids)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    trace = attention_steps(chosen.attn, seen["qkv"][1], seen["wo"])

    c = model.config
    b = f"block {block}:"
    btd = "[batch, context_length, d_model]"
    steps = [
        Step("ids", list(ids.shape), "token ids: [batch, context_length]"),
        Step("token embedding", list(seen["embedding"][1].shape),
             f"{btd}, scaled by sqrt(d_model)"),
        Step(f"+ {'positional encoding' if c.positional == 'sinusoidal' else 'position embedding'}",
             list(seen["embed_dropout"][0].shape), btd),
    ]
    if c.norm == "pre":
        steps.append(Step(f"{b} LayerNorm", list(seen["ln1"][1].shape), btd))
    steps += [
        Step(f"{b} Q, K, V (each)", list(trace["q"].shape), f"{btd}: x.Wq, x.Wk, x.Wv"),
        Step(f"{b} heads (Q; K, V alike)", list(trace["heads"].shape),
             "[batch, num_heads, context_length, head_size]"),
        Step(f"{b} scores Q.K^T/sqrt(head_size)", list(trace["scores"].shape),
             "[batch, num_heads, context_length, context_length]"),
        Step(f"{b} mask (-inf above diagonal)", list(trace["masked"].shape), "the future is hidden"),
        Step(f"{b} softmax", list(trace["softmax"].shape), "attention weights; each row sums to 1"),
        Step(f"{b} weighted sum (weights.V)", list(trace["weighted"].shape),
             "[batch, num_heads, context_length, head_size]"),
        Step(f"{b} merged heads", list(trace["merged"].shape), btd),
        Step(f"{b} Wo", list(trace["wo"].shape), f"{btd}: the output projection"),
    ]
    if c.norm == "post":
        steps.append(Step(f"{b} residual + LayerNorm", list(seen["ln1"][1].shape),
                          "Add & Norm: LayerNorm(x + attention)"))
    else:
        steps += [Step(f"{b} residual", list(seen["ln2"][0].shape), "x + attention"),
                  Step(f"{b} LayerNorm", list(seen["ln2"][1].shape), btd)]
    steps += [
        Step(f"{b} FFN hidden (ReLU)", list(seen["ffn_up"][1].shape),
             "[batch, context_length, ffn_mult * d_model]"),
        Step(f"{b} FFN", list(seen["ffn"][1].shape), btd),
    ]
    if c.norm == "post":
        steps.append(Step(f"{b} residual + LayerNorm", list(seen["ln2"][1].shape),
                          "Add & Norm: LayerNorm(x + FFN)"))
    else:
        steps.append(Step(f"{b} residual", list(seen["block"][1].shape), "x + FFN"))
    if c.num_blocks > 1:
        steps.append(Step(f"... x {c.num_blocks} blocks", list(seen["block"][1].shape), btd))
    if c.norm == "pre":
        steps.append(Step("final LayerNorm", list(seen["ln_f"][1].shape), btd))
    steps.append(Step("logits", list(seen["head"][1].shape), "[batch, context_length, vocab_size]"))
    return steps, trace


def attention_steps(attn, qkv: torch.Tensor, wo: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """The article's attention steps from the block's x·[Wq Wk Wv] output [batch, T, 3 * d_model]."""
    q, k, v = qkv.split(qkv.shape[-1] // 3, dim=2)  # each [batch, T, d_model]
    heads = [attn.split_heads(t) for t in (q, k, v)]  # each [batch, num_heads, T, head_size]
    scores = attn.scores(heads[0], heads[1])
    masked = attn.masked(scores)
    softmax = torch.softmax(masked, dim=-1)
    return {"q": q, "k": k, "v": v, "heads": heads[0], "scores": scores, "masked": masked,
            "softmax": softmax, "weighted": softmax @ heads[2], "merged": wo[0], "wo": wo[1]}


def token_label(tokenizer: Tokenizer, token_id: int) -> str:
    """A token as an axis label: newlines and tabs visible, `$` not read as mathtext."""
    text = tokenizer.decode([token_id])
    return text.replace("\n", "\\n").replace("\t", "\\t").replace("$", r"\$")


def inspect_model(model: GPT, tokenizer: Tokenizer, prompt: str, batch_size: int = 4,
                  block: int = 0) -> Inspection:
    """Trace one forward pass over `batch_size` windows of `prompt`."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r}: the number of prompt windows; give a whole "
                          "number of at least 1.")
    device = next(model.parameters()).device
    ids = prompt_windows(tokenizer.encode_prompt(prompt), batch_size, model.config.context_length)
    ids = ids.to(device)
    steps, trace = trace_forward(model, ids, block)
    if model.config.positional == "sinusoidal":
        positional = model.positional_encoding
    else:
        positional = model.position_embedding.weight
    return Inspection(config=model.config, block=block, ids=ids.cpu(),
                      tokens=[token_label(tokenizer, int(i)) for i in ids[0]], steps=steps,
                      trace={k: v.cpu() for k, v in trace.items()}, positional=positional.detach().cpu())


def random_model(settings: dict, prompt: str, encoding: str = "cl100k_base", compact_vocab: bool = True,
                 seed: int = 0) -> tuple[GPT, Tokenizer]:
    """The articles' model with random weights; with compact_vocab its vocabulary is the prompt's
    own tokens (the articles fit theirs on their text), else all of the encoding's."""
    base = Tokenizer(encoding)
    tokenizer = Tokenizer.fit(encoding, base.encode_tiktoken(str(prompt or "") or "\n"), compact_vocab)
    try:
        config = GPTConfig(**{**settings, "vocab_size": tokenizer.vocab_size})
    except TypeError as e:  # a key GPTConfig does not have
        raise ConfigError(f"model: {e}; the keys are those of gptlab.model.GPTConfig.") from None
    torch.manual_seed(seed)
    return GPT(config).eval(), tokenizer


# ---------------------------------------------------------------- the figures
def positional_figure(inspection: Inspection) -> Figure:
    pe = inspection.positional.numpy()  # [context_length, d_model]
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(pe, aspect="auto", cmap="RdBu_r", interpolation="nearest")
    sinusoidal = inspection.config.positional == "sinusoidal"
    ax.set_title(("Sinusoidal positional encoding" if sinusoidal else "Learned position embedding")
                 + f"  [context_length={pe.shape[0]}, d_model={pe.shape[1]}]")
    ax.set_xlabel("dimension (even: sin, odd: cos)" if sinusoidal else "dimension")
    ax.set_ylabel("position")
    fig.colorbar(image, ax=ax)
    return fig


def attention_figure(inspection: Inspection, name: str) -> Figure:
    """One panel per head for the first window: `name` is scores, masked or softmax."""
    values = inspection.trace[name][0].float().numpy()  # [num_heads, T, T]
    num_heads, length = values.shape[0], values.shape[-1]
    cols = min(num_heads, 4)
    rows = -(-num_heads // cols)
    panel = min(9.0, 2.2 + 0.14 * length)  # inches per head
    fig = Figure(figsize=(cols * panel + 1.2, rows * panel + 0.8), layout="constrained")
    finite = values[np.isfinite(values)]
    vmin, vmax = (0.0, 1.0) if name == "softmax" else (float(finite.min()), float(finite.max()))
    fontsize = max(5.0, min(9.0, 200 / length))
    ticks = range(length)
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for h, ax in enumerate(axes.flat):
        if h >= num_heads:
            ax.set_visible(False)
            continue
        shown = np.ma.masked_invalid(np.where(np.isinf(values[h]), np.nan, values[h]))
        image = ax.imshow(shown, vmin=vmin, vmax=vmax, cmap=_cmap(), interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xticks(ticks, inspection.tokens, rotation=90, fontsize=fontsize)
        ax.set_xlabel("key (attended to)", fontsize=8)
        if h % cols == 0:  # the query tokens once per row
            ax.set_yticks(ticks, inspection.tokens, fontsize=fontsize)
            ax.set_ylabel("query", fontsize=8)
        else:
            ax.set_yticks(ticks, [])
    fig.colorbar(image, ax=axes, shrink=0.8)
    fig.suptitle(f"Block {inspection.block}: {ATTENTION_FIGURES[name]}", fontsize=11)
    return fig


def _cmap():
    from matplotlib import colormaps

    return colormaps["viridis"].with_extremes(bad="lightgrey")  # grey: the masked future


def draw(inspection: Inspection) -> dict[str, Figure]:
    """The figures, by file stem: positional_encoding and attention_block<b>_<step>."""
    figures = {"positional_encoding": positional_figure(inspection)}
    for name in ATTENTION_FIGURES:
        figures[f"attention_block{inspection.block}_{name}"] = attention_figure(inspection, name)
    return figures


def save_figures(figures: dict[str, Figure], out_dir: str | Path, dpi: int = 100) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, fig in figures.items():
        paths.append(out_dir / f"{stem}.png")
        fig.savefig(paths[-1], dpi=dpi, bbox_inches="tight")  # long token labels stay whole
    return paths


def images_to_tensorboard(paths: list[Path], log_dir: Path, step: int) -> None:
    """The saved PNGs into the run's own event directory, so TensorBoard shows them with the
    run (IMAGES tab, `inspect/<name>`) at the checkpoint's step."""
    from matplotlib.image import imread
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for path in paths:
            image = imread(path)[..., :3]  # [height, width, RGB] floats in [0, 1]
            writer.add_image(f"inspect/{path.stem}", image, global_step=step, dataformats="HWC")
    finally:
        writer.close()


# ---------------------------------------------------------------- the tool
def look_inside(cfg: DictConfig) -> Inspection:
    """gptlab-inspect's work: build or load the model, print the steps, write the figures."""
    check_whole_number(cfg, "block", 0, "the block whose attention is drawn")
    check_whole_number(cfg, "batch_size", 1, "the number of prompt windows")
    run_dir, step = None, 0
    if cfg.ckpt_path:
        from gptlab.checkpoints import find_checkpoint, load_checkpoint, load_module

        path = find_checkpoint(cfg.ckpt_path)
        if Path(cfg.ckpt_path).is_dir():
            run_dir = Path(cfg.ckpt_path)
        module = load_module(path)
        model, tokenizer = module.model, module.tokenizer
        step = int(load_checkpoint(path).get("global_step", 0))
        log.info("Model from %s (step %d)", path, step)
    else:
        settings = OmegaConf.to_container(cfg.model, resolve=True)
        model, tokenizer = random_model(settings, cfg.prompt, cfg.encoding, cfg.compact_vocab, cfg.seed)
        log.info("A model with random weights (seed %d): no ckpt_path given", cfg.seed)
    inspection = inspect_model(model, tokenizer, cfg.prompt, cfg.batch_size, cfg.block)

    c = inspection.config
    print(f"GPT: d_model {c.d_model}, {c.num_heads} heads of {c.head_size}, {c.num_blocks} block(s), "
          f"{c.norm}-LN, vocab {c.vocab_size}; {inspection.ids.shape[0]} window(s) of "
          f"{inspection.ids.shape[1]} prompt tokens")
    for s in inspection.steps:
        print(s.line())
    sys.stdout.flush()

    figures = draw(inspection)
    paths = save_figures(figures, cfg.output_dir)
    log.info("Figures:\n%s", "\n".join(f"  {p}" for p in paths))
    if run_dir is not None and cfg.tensorboard:
        images_to_tensorboard(paths, run_dir / "tensorboard", step)
        log.info("Also in TensorBoard (IMAGES tab, inspect/*): tensorboard --logdir %s", run_dir)
    return inspection


def run_job(cfg: DictConfig) -> None:
    """The Hydra task: bad input ends in one clear paragraph and exit code 2."""
    run_or_exit(look_inside, cfg, log)


@hydra.main(version_base="1.3", config_path="pkg://gptlab.conf", config_name="inspect")
def hydra_main(cfg: DictConfig) -> None:
    run_job(cfg)


def main() -> None:
    """Console entry point `gptlab-inspect`."""
    main_or_exit(hydra_main, "gptlab-inspect")


if __name__ == "__main__":
    main()
