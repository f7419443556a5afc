"""The GPT's settings: every architecture knob, checked when the config is built, before any data
is touched. Plain Python (no torch), so a tool checks a command line before its heavy imports."""

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from gptlab.errors import ConfigError


def fits(annotation: Any, value: Any) -> bool:
    """Whether `value` is of a field's type: int, float (an int too), bool, str, or Optional."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(fits(a, value) for a in typing.get_args(annotation))
    if isinstance(value, bool):  # a bool is an int to isinstance, never a number here
        return annotation is bool
    return isinstance(value, (int, float) if annotation is float else annotation)


def ffn_hidden(d_model: int, ffn_mult: int, activation: str) -> int:
    """The FFN's width: ffn_mult * d_model. SwiGLU has three matrices instead of two, so it gets
    2/3 of that width (rounded), which keeps its parameters and FLOPs about the same (LLaMA's)."""
    if activation == "swiglu":
        return round(2 * ffn_mult * d_model / 3)
    return ffn_mult * d_model


def block_params(d_model: int, num_blocks: int, ffn_mult: int, activation: str) -> int:
    """The blocks' weight matrices (GPT.block_matrices): Wq, Wk, Wv, Wo and the FFN's two (three
    with SwiGLU), per block."""
    ffn = (3 if activation == "swiglu" else 2) * d_model * ffn_hidden(d_model, ffn_mult, activation)
    return num_blocks * (4 * d_model * d_model + ffn)


@dataclass
class GPTConfig:
    """gptlab's defaults (conf/model/ overrides them); vocab_size and context_length: the data's."""

    vocab_size: int | None = None
    context_length: int = 64
    d_model: int = 128
    num_heads: int = 4
    num_blocks: int = 4
    dropout: float = 0.2  # the corpus is small (78k tokens): regularise
    ffn_mult: int = 4
    norm: str = "pre"  # pre: LayerNorm before each sublayer; post: the article's Add & Norm
    positional: str = "sinusoidal"  # the article's fixed formula | learned | rope (in attention)
    attention: str = "sdpa"  # sdpa (fused) | manual (the article's steps)
    tie_weights: bool = False
    bias: bool = True
    compile: bool = False
    norm_layer: str = "layernorm"  # the articles' | rmsnorm (no mean subtracted, no bias)
    qk_norm: bool = False  # RMSNorm of each head's queries and keys before Q·Kᵀ
    activation: str = "relu"  # the FFN's: relu (the articles') | gelu | gelu_new | relu2 | swiglu
    norm_eps: float | None = None  # the norms' eps; None: torch's (LayerNorm 1e-5, RMSNorm fp32's)
    rope_theta: float = 10000.0  # RoPE's base: pos / rope_theta^(2i / head_size)
    logit_softcap: float | None = None  # logits = cap * tanh(logits / cap); None or 0: off
    zero_init: bool = False  # Wo and the FFN's last linear start at zero
    parametrization: str = "standard"  # standard | mup (μP: model/mup.py, docs/model.md)
    base_width: int = 128  # μP's base d_model: there μP is the standard parametrisation
    base_depth: int | None = None  # CompleteP's base num_blocks under mup; None: no depth rule
    # μTransfer's base multipliers (model/mup.py), tuned at the base width with the rate and
    # carried to every width: the logits', the token embedding's, the hidden matrices' initial
    # std and the attention scale's; 1: the rules alone
    mup_output: float = 1.0
    mup_embedding: float = 1.0
    mup_init: float = 1.0
    mup_attention: float = 1.0
    # model.depth=N: the one knob that derives the width, heads, blocks and the training settings
    # (gptlab.config.depth, docs/training.md); None: each is its own key
    depth: int | None = None

    # the settings a trained model's weights do not depend on (depth: the knob that set the
    # others, which say the architecture): anything else names another model
    TRAINING_ONLY = ("dropout", "attention", "compile", "zero_init", "mup_init", "depth")

    def __post_init__(self) -> None:
        self.check_types()
        self.check_sizes()
        self.check_choices()

    @classmethod
    def architecture(cls) -> list[str]:
        """The settings that decide what the weights are: every field but TRAINING_ONLY."""
        return [f.name for f in dataclasses.fields(cls) if f.name not in cls.TRAINING_ONLY]

    def check_types(self) -> None:
        for key, kind in typing.get_type_hints(GPTConfig).items():
            value = getattr(self, key)
            if not fits(kind, value):
                name = getattr(kind, "__name__", str(kind))
                raise ConfigError(f"model.{key}={value!r}: it must be of type {name}.")

    def check_sizes(self) -> None:
        sizes = ("context_length", "d_model", "num_heads", "num_blocks", "ffn_mult", "vocab_size")
        sizes += ("base_width", "base_depth", "depth")
        for key in sizes:
            value = getattr(self, key)  # ints or None (vocab_size until the data sets it)
            if value is not None and value < 1:
                raise ConfigError(f"model.{key}={value}: it must be a positive integer.")
        if self.d_model % self.num_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.num_heads="
                f"{self.num_heads}: each head gets head_size = d_model // num_heads features. "
                f"Pick num_heads among the divisors of {self.d_model}, or change d_model."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout}: it must satisfy 0 <= dropout < 1.")
        if self.logit_softcap is not None and self.logit_softcap < 0:
            raise ConfigError(
                f"model.logit_softcap={self.logit_softcap}: give a positive cap (e.g. 30), "
                "or null or 0 for no cap."
            )
        multipliers = ("mup_output", "mup_embedding", "mup_init", "mup_attention")
        for key in ("norm_eps", "rope_theta", *multipliers):
            value = getattr(self, key)
            if value is not None and not value > 0:  # NaN too
                raise ConfigError(f"model.{key}={value}: it must be positive.")

    def check_choices(self) -> None:
        for key, allowed in (
            ("norm", ("pre", "post")),
            ("positional", ("sinusoidal", "learned", "rope")),
            ("attention", ("manual", "sdpa")),
            ("norm_layer", ("layernorm", "rmsnorm")),
            ("activation", ("relu", "gelu", "gelu_new", "relu2", "swiglu")),
            ("parametrization", ("standard", "mup")),
        ):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"model.{key}={getattr(self, key)!r}: choose one of {allowed}.")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ConfigError(
                f"model.d_model={self.d_model}: the sinusoidal encoding pairs sin and cos "
                "features, so d_model must be even (or use model.positional=learned)."
            )
        if self.positional == "rope" and self.head_size % 2:
            raise ConfigError(
                f"model.positional=rope with head_size {self.head_size} (model.d_model="
                f"{self.d_model} / model.num_heads={self.num_heads}): RoPE rotates pairs of "
                "features, so head_size must be even. Change d_model or num_heads, or use "
                "model.positional=sinusoidal or learned."
            )

    @property
    def head_size(self) -> int:
        return self.d_model // self.num_heads

    @property
    def ffn_hidden(self) -> int:
        return ffn_hidden(self.d_model, self.ffn_mult, self.activation)
