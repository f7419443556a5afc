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
    cooldown_fraction: float = 0.2  # schedule=wsd: the last fraction of the run's steps
    cooldown_shape: str = "1-sqrt"  # schedule=wsd: 1-sqrt | linear, from lr down to min_lr
    branch_at: list[float] = field(default_factory=list)  # wsd: checkpoints to branch from

    def __post_init__(self) -> None:
        """Each setting in its range or among its choices; min_lr at most lr where it decays;
        branch_at in wsd's stable phase (its steps: check_schedule, once the length is known)."""
        self.betas = [float(b) for b in self.betas]
        self.branch_at = [float(f) for f in self.branch_at]
        ranges = {
            "lr": (self.lr > 0, "the learning rate must be positive"),
            "weight_decay": (self.weight_decay >= 0, "it must be 0 or more"),
            "betas": (
                len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas),
                "give two numbers in [0, 1), e.g. [0.9,0.95]",
            ),
            "warmup_steps": (self.warmup_steps >= 0, "it must be 0 or more"),
            "min_lr": (self.min_lr >= 0, "it must be 0 or more"),
            "muon_lr": (self.muon_lr > 0, "the learning rate must be positive"),
            "muon_momentum": (0.0 <= self.muon_momentum < 1.0, "it must be in [0, 1), e.g. 0.95"),
            "cooldown_fraction": (
                0.0 < self.cooldown_fraction < 1.0,
                "the cooldown's share of the run's steps must be in (0, 1), e.g. 0.2",
            ),
        }
        for key, (ok, rule) in ranges.items():
            if not ok:
                raise ConfigError(f"optim.{key}={getattr(self, key)}: {rule}.")
        for key, choices in CHOICES.items():
            if getattr(self, key) not in choices:
                raise ConfigError(f"optim.{key}={getattr(self, key)!r}: choose one of {choices}.")
        if self.schedule != "constant" and self.min_lr > self.lr:
            raise ConfigError(
                f"optim.min_lr={self.min_lr} is above optim.lr={self.lr}: the {self.schedule} "
                "schedule decays from lr down to min_lr. Lower optim.min_lr."
            )
        if self.branch_at and self.schedule != "wsd":
            raise ConfigError(
                f"optim.branch_at={self.branch_at}: branches are cooldowns from a constant "
                f"learning rate, so they need optim.schedule=wsd (now {self.schedule!r})."
            )
        stable_end = 1.0 - self.cooldown_fraction
        if not all(0.0 < f <= stable_end for f in self.branch_at):
            raise ConfigError(
                f"optim.branch_at={self.branch_at}: each must be a fraction of the run's steps in "
                f"(0, {stable_end:g}], before the cooldown (optim.cooldown_fraction="
                f"{self.cooldown_fraction}) starts."
            )


CHOICES = {
    "schedule": ("cosine", "constant", "wsd"),
    "name": ("adamw", "muon"),  # Muon for the blocks' matrices, AdamW for the rest
    "muon_adjust_lr": ("original", "match_rms_adamw"),
    "cooldown_shape": ("1-sqrt", "linear"),
}


def cooldown_start(optim: OptimConfig, total_steps: int) -> int:
    """wsd: the first step of the cooldown, which spans the last cooldown_fraction of the steps."""
    return total_steps - round(optim.cooldown_fraction * total_steps)


def branch_steps(optim: OptimConfig, total_steps: int) -> list[int]:
    """The steps whose checkpoints a wsd run keeps for branches (floor: never in the cooldown)."""
    return [math.floor(f * total_steps) for f in optim.branch_at]


def branch_length(optim: OptimConfig, step: int) -> int:
    """The steps of the wsd run whose cooldown starts exactly at `step`: a branch from `step`
    trains that run's cooldown only (about step / (1 - cooldown_fraction) in all)."""
    total = step
    while cooldown_start(optim, total) < step:  # it grows by 0 or 1 a step: lands on `step`
        total += 1
    return total


def check_schedule(optim: OptimConfig, total_steps: int) -> None:
    """wsd's phases in whole steps, once the run's length is known: the warmup ends before the
    cooldown starts; each branch step is after the warmup, and a distinct step."""
    if optim.schedule != "wsd":
        return
    start = cooldown_start(optim, total_steps)
    if start < optim.warmup_steps:
        raise ConfigError(
            f"optim.schedule=wsd: the cooldown starts at step {start} of {total_steps}, inside "
            f"the warmup (optim.warmup_steps={optim.warmup_steps}). Lower optim.warmup_steps or "
            "optim.cooldown_fraction, or train more steps (trainer.max_steps)."
        )
    steps = branch_steps(optim, total_steps)
    if len(set(steps)) < len(steps) or any(s < max(1, optim.warmup_steps) for s in steps):
        raise ConfigError(
            f"optim.branch_at={optim.branch_at}: at {total_steps} steps these are steps {steps}; "
            f"each must be a distinct step after the warmup (optim.warmup_steps="
            f"{optim.warmup_steps}). Choose other fractions or train more steps."
        )


def lr_factor(step: int, optim: OptimConfig, total_steps: int) -> float:
    """Multiplier of optim.lr at a given step."""
    if optim.schedule == "constant":
        return 1.0
    if step < optim.warmup_steps:
        return (step + 1) / optim.warmup_steps
    min_factor = optim.min_lr / optim.lr
    if optim.schedule == "wsd":  # constant, then the cooldown (Hagele et al. 2024)
        start = cooldown_start(optim, total_steps)
        t = min(1.0, max(0, step - start) / max(1, total_steps - start))
        decay = 1.0 - math.sqrt(t) if optim.cooldown_shape == "1-sqrt" else 1.0 - t
        return min_factor + (1.0 - min_factor) * decay
    progress = min(1.0, (step - optim.warmup_steps) / max(1, total_steps - optim.warmup_steps))
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))
