"""gptlab-inspect coord_check=true: μP's coordinate check (Yang et al. 2022, Tensor Programs V).
Each width trains a few AdamW steps, through gptlab's own optimizer groups, on windows of the
prompt; each layer's activation scale (mean |x|) is recorded after every step. Under μP the
curves stay flat as d_model grows; under the standard parametrisation logits and attention grow."""

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from gptlab.data.tokenizer import Tokenizer
from gptlab.model.config import GPTConfig
from gptlab.run.place import PLACE
from gptlab.training.module import GPTModule
from gptlab.training.optim_config import OptimConfig

PARAMETRIZATIONS = ("standard", "mup")
FLAT_SLOPE = 0.3  # d log mean|x| / d log d_model: below it no growth (μP); 8x wider, 1.9x


def prompt_windows(prompt: str, encoding: str, length: int, batch: int):
    """The prompt's vocabulary (compact) and `batch` windows of length + 1 of its ids [batch, T+1],
    evenly spread (the prompt must hold length + 1 tokens)."""
    tokenizer = Tokenizer.fit(encoding, Tokenizer(encoding).encode_tiktoken(prompt), True)
    ids = tokenizer.encode_prompt(prompt)
    starts = np.linspace(0, max(0, len(ids) - length - 1), batch).round().astype(int)
    return tokenizer, torch.tensor([ids[s : s + length + 1] for s in starts])


def layer_scales(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, float]:
    """Mean |x| of the embedding, each block's attention logits, attention, FFN and output, and
    the logits, from the model's own forward on ids [batch, T] (hooks)."""
    outputs = {}
    named = {model.dropout: "embedding", model.head: "logits"}
    for i, block in enumerate(model.blocks):
        named |= {block.attn.q_norm: f"{i}.q", block.attn.k_norm: f"{i}.k"}
        named |= {block.attn: f"block {i} attention", block.ffn: f"block {i} FFN"}
        named[block] = f"block {i} output"

    def remember(module, args, output):
        if module in named:
            outputs[named[module]] = output

    with torch.nn.modules.module.register_module_forward_hook(remember), torch.no_grad():
        model(ids)
    outputs["logits"] = outputs["logits"] * model.output_mult  # the multiplier follows the head
    for i, block in enumerate(model.blocks):
        q = block.attn.rotary(outputs.pop(f"{i}.q"))  # [batch, heads, T, head_size]
        k = block.attn.rotary(outputs.pop(f"{i}.k"))  # as attention uses them: RoPE'd
        scale = block.attn.scale or 1 / math.sqrt(block.attn.head_size)
        outputs[f"block {i} attention logits"] = q @ k.transpose(-2, -1) * scale  # [b, h, T, T]
    return {name: float(x.abs().mean()) for name, x in outputs.items()}


def train_and_record(
    config: GPTConfig, tokenizer: Tokenizer, ids: torch.Tensor, steps: int, lr: float, seed: int
) -> list[dict[str, float]]:
    """The layer scales before training and after each of `steps` AdamW steps at a constant lr."""
    torch.manual_seed(seed)
    hparams = GPTModule.hparams_from(config, OptimConfig(lr=lr, min_lr=0.0), tokenizer)
    module = GPTModule.fresh(hparams)
    optimizer = module.build_optimizer()
    x, y = ids[:, :-1], ids[:, 1:]  # [batch, T] each: next-token targets
    scales = [layer_scales(module.model, x)]
    for _ in range(steps):
        logits = module.model(x)  # [batch, T, vocab_size]
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scales.append(layer_scales(module.model, x))
    return scales


def coord_check(
    settings: dict, tokenizer: Tokenizer, ids: torch.Tensor, widths, steps: int, lr: float, seeds
) -> dict[str, dict[int, list[dict[str, float]]]]:
    """{parametrization: {width: [scales at step 0..steps], averaged over seeds}}."""
    results = {}
    for name in PARAMETRIZATIONS:
        results[name] = {}
        for width in widths:
            changes = {"d_model": width, "parametrization": name}
            config = GPTConfig(**{**settings, **changes, "vocab_size": tokenizer.vocab_size})
            runs = [train_and_record(config, tokenizer, ids, steps, lr, s) for s in seeds]
            results[name][width] = [
                {layer: float(np.mean([run[t][layer] for run in runs])) for layer in runs[0][t]}
                for t in range(steps + 1)
            ]
    return results


def slope(by_width: dict[int, list[dict[str, float]]], layer: str) -> float:
    """How a layer's scale grows with width by the last step: the least-squares slope in log-log."""
    widths = sorted(by_width)
    scales = [by_width[w][-1][layer] for w in widths]
    return float(np.polyfit(np.log(widths), np.log(scales), 1)[0])


def coord_figure(results: dict, settings: dict) -> Figure:
    """A row per parametrisation; columns: at initialisation and after the last step."""
    steps = len(next(iter(results["mup"].values()))) - 1
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True)
    for row, name in enumerate(PARAMETRIZATIONS):
        widths = sorted(results[name])
        for col, step in enumerate((0, steps)):
            ax = axes[row, col]
            for layer in results[name][widths[0]][step]:
                scales = [results[name][w][step][layer] for w in widths]
                ax.plot(widths, scales, marker="o", label=layer)
            ax.set(xscale="log", yscale="log", xlabel="d_model", ylabel="mean |x|")
            ax.set_xticks(widths, [str(w) for w in widths], minor=False)
            ax.minorticks_off()
            ax.set_title(f"{name}: {'initialisation' if step == 0 else f'after {step} steps'}")
    axes[0, 1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    base = settings.get("base_width", GPTConfig.base_width)
    fig.suptitle(f"Coordinate check: activation scale against width (μP base_width {base})")
    return fig


def run_coord_check(cfg, out_dir: Path) -> dict:
    """gptlab-inspect coord_check=true: cfg.model at each of cfg.coord_widths, both
    parametrisations; prints each layer's growth with width, writes coord_check.png."""
    settings = {**cfg.model, "dropout": 0.0}
    length = settings.get("context_length", GPTConfig.context_length)
    tokenizer, ids = prompt_windows(cfg.prompt, cfg.encoding, length, cfg.batch_size)
    seeds = range(cfg.seed, cfg.seed + cfg.coord_seeds)
    widths = list(cfg.coord_widths)
    results = coord_check(settings, tokenizer, ids, widths, cfg.coord_steps, cfg.coord_lr, seeds)
    print(
        f"Growth of mean |x| with d_model {widths} after {cfg.coord_steps} steps (log-log slope):"
    )
    for layer in results["mup"][widths[0]][0]:
        slopes = "  ".join(f"{n} {slope(results[n], layer):+.2f}" for n in PARAMETRIZATIONS)
        print(f"  {layer:<28} {slopes}")
    path = out_dir / "coord_check.png"
    PLACE.save_figure(coord_figure(results, settings), path, dpi=90)
    print(f"Figure: {path}")
    return results
