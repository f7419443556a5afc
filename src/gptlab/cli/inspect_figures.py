"""gptlab-inspect's figures: the positional encoding, and attention as the articles draw it."""

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from gptlab.model.gpt import GPT
from gptlab.model.position import LearnedEmbedding, Rotary, SinusoidalEncoding

ATTENTION_FIGURES = {
    "scores": "attention scores Q·Kᵀ/√head_size, before the mask",
    "masked": "after the causal mask (-inf above the diagonal, grey)",
    "softmax": "after softmax: the attention weights (each row sums to 1)",
}
# attention figures: tokens drawn at most, inches a token (an 8-point label fits), inches of labels
FIGURE_TOKENS = 40
TOKEN_INCHES = 0.15
LABEL_INCHES = 1.1
POSITION_TABLES = (SinusoidalEncoding, LearnedEmbedding, Rotary)  # what positional_figure draws
AXIS_LABEL = str.maketrans({"\n": "\\n", "\t": "\\t", "$": r"\$"})  # `$` would start mathtext


def positional_figure(model: GPT) -> Figure:
    """The table added to the embeddings (sinusoidal or learned), or RoPE's angles as one."""
    holder = next(m for m in model.modules() if isinstance(m, POSITION_TABLES))
    pe = holder.table.detach().cpu().numpy()
    sinusoidal = not isinstance(holder, LearnedEmbedding)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    fig.colorbar(ax.imshow(pe, aspect="auto", cmap="RdBu_r", interpolation="nearest"), ax=ax)
    name = "Sinusoidal positional encoding" if sinusoidal else "Learned position embedding"
    title = f"{name}  [context_length={pe.shape[0]}, d_model={pe.shape[1]}]"
    xlabel = "dimension (even: sin, odd: cos)" if sinusoidal else "dimension"
    ax.set(title=title, ylabel="position", xlabel=xlabel)
    return fig


def attention_figure(trace: dict, tokens: list[str], name: str, block: int) -> Figure:
    """The first window's `name` step, a panel per head on one colour scale, -inf grey; at most
    FIGURE_TOKENS tokens, so 8-point labels stay readable (the first queries' rows are whole)."""
    values = trace[name][0].float().numpy()  # [num_heads, T, T]
    num_heads, _, length = values.shape
    shown = min(length, FIGURE_TOKENS)
    values = values[:, :shown, :shown]  # [num_heads, shown, shown]
    panel = max(2.4, TOKEN_INCHES * shown)  # inches per head
    cols = min(num_heads, 4 if panel <= 3.6 else 2)
    rows = -(-num_heads // cols)
    size = (cols * (panel + LABEL_INCHES) + 1.0, rows * (panel + LABEL_INCHES) + 0.6)
    fig = Figure(figsize=size, layout="constrained")
    finite = values[np.isfinite(values)]  # the weights (softmax): always on the scale 0 to 1
    vmin, vmax = (0.0, 1.0) if name == "softmax" else (float(finite.min()), float(finite.max()))
    cmap = colormaps["viridis"].with_extremes(bad="lightgrey")  # imshow masks what is not finite
    axes = [fig.add_subplot(rows, cols, h + 1) for h in range(num_heads)]
    for h, ax in enumerate(axes):
        image = ax.imshow(values[h], vmin=vmin, vmax=vmax, cmap=cmap, interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=10)
        ax.set_xticks(range(shown), tokens[:shown], rotation=90, fontsize=8)
        ax.set_xlabel("key (attended to)", fontsize=9)
        first = h % cols == 0  # the query tokens once per row
        ax.set_yticks(range(shown), tokens[:shown] if first else [], fontsize=8)
        ax.set_ylabel("query" if first else "", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.6)
    window = f", the window's first {shown} of {length} tokens" if shown < length else ""
    fig.suptitle(f"Block {block}{window}: {ATTENTION_FIGURES[name]}", fontsize=12)
    return fig
