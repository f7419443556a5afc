"""One knob (docs/training.md "One knob"): model.depth=N sets the width, the heads, the token
budget, the batch, the learning rate, its floor and warmup, and the weight decay, one rule a line
below, each read off the values it depends on as the run has them (derived or given). The configs
name each derived key as `${gptlab.depth:<key>}` (config/resolvers.py): a key given anywhere (the
command line, an experiment, a debug preset) replaces that interpolation, and so wins; without a
depth every key is its default, so no run changes unless a depth is given. Plain Python, no
torch: a bad depth is said before torch loads."""

import dataclasses
import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from gptlab.data.config import DataConfig
from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig, block_params
from gptlab.training.optim_config import OptimConfig

RESOLVER = "gptlab.depth"
# the reference rung: gptlab's default model (d_model 128 = ASPECT x 4 blocks, 4 heads of
# HEAD_SIZE) trained with gptlab's defaults (batch 16 x 64 tokens, lr 3e-3, weight decay 0.1)
REFERENCE_DEPTH = GPTConfig.num_blocks
ASPECT = GPTConfig.d_model // GPTConfig.num_blocks  # d_model per block: 32 (nanochat's is 64)
HEAD_SIZE = GPTConfig.d_model // GPTConfig.num_heads  # 32 (nanochat's head_dim is 128)
BATCH_EXPONENT = 0.383  # B_opt ∝ D^0.383 (Power Lines, Bergsma et al. 2025), as nanochat
WARMUP_FRACTION = 1 / 12  # gptlab's default: 100 warmup steps of 1,200
MIN_LR_FRACTION = 0.1  # gptlab's default: min_lr 3e-4 for lr 3e-3


def width(depth: int) -> int:
    """d_model = ASPECT x depth, rounded up to whole heads (nanochat's rule)."""
    return HEAD_SIZE * math.ceil(ASPECT * depth / HEAD_SIZE)


def heads(d_model: int) -> int:
    """The most heads of at least HEAD_SIZE features that divide d_model (nanochat's)."""
    return max(h for h in range(1, max(1, d_model // HEAD_SIZE) + 1) if d_model % h == 0)


def budget(n: int, tokens_per_param: float) -> float:
    """The token budget D = tokens_per_param x N (Chinchilla's 20 by default; nanochat's)."""
    return tokens_per_param * n


def batch_tokens(d: float, d_ref: float, b_ref: int) -> int:
    """B = B_ref (D / D_ref)^0.383, to the nearest power of 2 (nanochat's)."""
    return 2 ** round(math.log2(b_ref * (d / d_ref) ** BATCH_EXPONENT))


def learning_rate(b: int, b_ref: int, d_model: int, mup: bool) -> float:
    """lr_ref sqrt(B / B_ref) (AdamW's, nanochat's), times (d_model / d_ref)^-0.5 (nanochat's
    AdamW width rule) under the standard parametrisation; μP scales each layer by width itself."""
    width_scale = 1.0 if mup else (d_model / GPTConfig.d_model) ** -0.5
    return OptimConfig.lr * math.sqrt(b / b_ref) * width_scale


def weight_decay(b: int, b_ref: int, lr: float, d: float, d_ref: float) -> float:
    """AdamW's timescale 1 / (lr x wd) a constant share of the run's D / B steps (Wang and
    Aitchison 2024's T_epoch): wd_ref (B / B_ref)(lr_ref / lr)(D_ref / D); with lr ∝ sqrt(B)
    alone it is nanochat's wd_ref sqrt(B / B_ref)(D_ref / D)."""
    return OptimConfig.weight_decay * (b / b_ref) * (OptimConfig.lr / lr) * (d_ref / d)


def steps(d: float, step_tokens: int) -> int:
    """The optimizer steps that spend D tokens, step_tokens a step."""
    return round(d / step_tokens)


def warmup(max_steps: int) -> int:
    return round(WARMUP_FRACTION * max_steps)


def min_lr(lr: float) -> float:
    return MIN_LR_FRACTION * lr


DERIVED = (
    "model.num_blocks",
    "model.d_model",
    "model.num_heads",
    "data.batch_size",
    "trainer.max_steps",
    "optim.lr",
    "optim.min_lr",
    "optim.weight_decay",
    "optim.warmup_steps",
)
SETTINGS = {"model": GPTConfig, "data": DataConfig, "optim": OptimConfig}  # their defaults


@dataclasses.dataclass(frozen=True)
class Rung:
    """What the rules ask of one run, from the values it has (`cfg`: derived or given)."""

    cfg: DictConfig

    def get(self, key: str, default: Any = None) -> Any:
        return OmegaConf.select(self.cfg, key, default=default)

    @property
    def depth(self) -> int:
        return check_depth(self.get("model.depth"))

    @property
    def n(self) -> int:
        """N: the blocks' matrices (the head's size is the corpus's vocabulary's, unknown here)."""
        return self.blocks(self.get("model.d_model"), self.get("model.num_blocks"))

    def blocks(self, d_model: int, num_blocks: int) -> int:
        ffn_mult, activation = self.get("model.ffn_mult"), self.get("model.activation")
        return block_params(d_model, num_blocks, ffn_mult, activation)

    @property
    def n_ref(self) -> int:
        """The reference rung's N, of this run's block shape (ffn_mult, activation)."""
        return self.blocks(width(REFERENCE_DEPTH), REFERENCE_DEPTH)

    @property
    def tokens_per_param(self) -> float:
        return check_ratio(self.get("tokens_per_param"))

    @property
    def d(self) -> float:
        return budget(self.n, self.tokens_per_param)

    @property
    def d_ref(self) -> float:
        return budget(self.n_ref, self.tokens_per_param)

    @property
    def b_ref(self) -> int:
        return DataConfig.batch_size * DataConfig.context_length  # tokens: 16 x 64

    @property
    def ranks(self) -> int:
        """The processes the batch is split over, as the trainer config says (an int or a list
        of devices; anything else: one, checked against Lightning's count when the run starts)."""
        devices = self.get("trainer.devices", 1)
        count = len(devices) if OmegaConf.is_list(devices) else devices
        count = count if isinstance(count, int) and count > 0 else 1
        return count * int(self.get("trainer.num_nodes", 1) or 1)

    @property
    def step_windows(self) -> int:
        """Windows a step over every rank: data.batch_size x ranks x accumulated batches."""
        accumulated = int(self.get("trainer.accumulate_grad_batches", 1) or 1)
        return self.get("data.batch_size") * self.ranks * accumulated

    @property
    def b(self) -> int:
        """The batch in tokens: a step's windows x context_length."""
        return self.step_windows * self.get("data.context_length")

    def value(self, key: str) -> Any:
        """The rule's value of `key` for this run."""
        if key == "model.num_blocks":
            return self.depth
        if key == "model.d_model":
            return width(self.depth)
        if key == "model.num_heads":
            return heads(self.get("model.d_model"))
        if key == "data.batch_size":
            per_rank = self.ranks * int(self.get("trainer.accumulate_grad_batches", 1) or 1)
            windows = batch_tokens(self.d, self.d_ref, self.b_ref) / self.get("data.context_length")
            return max(1, round(windows / per_rank))
        if key == "trainer.max_steps":
            return check_steps(self, steps(self.d, self.b))
        if key == "optim.lr":
            mup = self.get("model.parametrization") == "mup"
            return learning_rate(self.b, self.b_ref, self.get("model.d_model"), mup)
        if key == "optim.min_lr":
            return min_lr(self.get("optim.lr"))
        if key == "optim.weight_decay":
            return weight_decay(self.b, self.b_ref, self.get("optim.lr"), self.d, self.d_ref)
        if key == "optim.warmup_steps":
            return warmup(self.get("trainer.max_steps"))
        raise KeyError(key)


def default(key: str) -> Any:
    """A derived key's value without a depth: its settings dataclass's default."""
    group, _, field = key.partition(".")
    return SETTINGS[group].__dataclass_fields__[field].default


def derived(key: str, *otherwise: Any, _root_: DictConfig) -> Any:
    """The resolver `${gptlab.depth:<key>}`: the rule's value with a depth, else the value the
    config gives after the key (trainer/default.yaml's 1,200 steps) or the key's settings
    dataclass's default."""
    if key not in DERIVED:
        raise ConfigError(f"${{{RESOLVER}:{key}}}: no rule derives {key} (they derive {DERIVED}).")
    if OmegaConf.select(_root_, "model.depth") is None:
        return otherwise[0] if otherwise else default(key)
    return Rung(_root_).value(key)


def check_depth(depth: Any) -> int:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ConfigError(
            f"model.depth={depth}: the depth is a number of blocks, a positive integer (1, 2, "
            "...); every other setting follows from it (docs/training.md, One knob)."
        )
    return depth


def check_ratio(ratio: Any) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not ratio > 0:
        raise ConfigError(
            f"tokens_per_param={ratio}: model.depth's token budget is tokens_per_param x the "
            "blocks' parameters, so it must be a positive number (Chinchilla's 20, the default)."
        )
    return float(ratio)


def check_steps(rung: Rung, count: int) -> int:
    if count < 1:
        raise ConfigError(
            f"model.depth={rung.depth} with tokens_per_param={rung.tokens_per_param:g}: the token "
            f"budget, {rung.d:,.0f} tokens ({rung.tokens_per_param:g} x {rung.n:,} block "
            f"parameters), buys no optimizer step of {rung.b:,} tokens. Raise tokens_per_param "
            f"to at least {rung.b / rung.n:.3g}, or give trainer.max_steps."
        )
    return count
