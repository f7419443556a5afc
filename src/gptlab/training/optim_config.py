"""The optimizer's settings and its schedule: plain Python, so a tool checks a command line
before its heavy imports."""

import math
from dataclasses import dataclass, field

from gptlab.errors import ConfigError


@dataclass
class OptimConfig:
    """AdamW and its schedule (conf/optim/ only overrides these defaults); name=muon: Muon for
    the blocks' matrices at its own peak muon_lr, on the same schedule (docs/model.md)."""

    lr: float = 3e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    schedule: str = "cosine"
    warmup_steps: int = 100
    min_lr: float = 3e-4
    name: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW for the rest)
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    muon_adjust_lr: str = "original"  # Muon's lr by matrix shape: original | match_rms_adamw

    def __post_init__(self) -> None:
        self.check_adamw()
        self.check_muon()

    def check_adamw(self) -> None:
        self.betas = [float(b) for b in self.betas]
        if self.lr <= 0:
            raise ConfigError(f"optim.lr={self.lr}: the learning rate must be positive.")
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay={self.weight_decay}: it must be 0 or more.")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(
                f"optim.betas={self.betas}: give two numbers in [0, 1), e.g. [0.9,0.95]."
            )
        if self.schedule not in ("cosine", "constant"):
            raise ConfigError(
                f"optim.schedule={self.schedule!r}: choose one of ('cosine', 'constant')."
            )
        if self.warmup_steps < 0 or self.min_lr < 0:
            raise ConfigError("optim.warmup_steps and optim.min_lr must be 0 or more.")
        if self.schedule == "cosine" and self.min_lr > self.lr:
            raise ConfigError(
                f"optim.min_lr={self.min_lr} is above optim.lr={self.lr}: the cosine schedule "
                "decays from lr down to min_lr. Lower optim.min_lr."
            )

    def check_muon(self) -> None:
        if self.name not in ("adamw", "muon"):
            raise ConfigError(f"optim.name={self.name!r}: choose one of ('adamw', 'muon').")
        if self.muon_lr <= 0:
            raise ConfigError(f"optim.muon_lr={self.muon_lr}: the learning rate must be positive.")
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ConfigError(
                f"optim.muon_momentum={self.muon_momentum}: it must be in [0, 1), e.g. 0.95."
            )
        if self.muon_adjust_lr not in ("original", "match_rms_adamw"):
            raise ConfigError(
                f"optim.muon_adjust_lr={self.muon_adjust_lr!r}: choose one of "
                "('original', 'match_rms_adamw')."
            )


def lr_factor(step: int, optim: OptimConfig, total_steps: int) -> float:
    """Multiplier of optim.lr at a given step."""
    if optim.schedule == "constant":
        return 1.0
    if step < optim.warmup_steps:
        return (step + 1) / optim.warmup_steps
    progress = min(1.0, (step - optim.warmup_steps) / max(1, total_steps - optim.warmup_steps))
    min_factor = optim.min_lr / optim.lr
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))
