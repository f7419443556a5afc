"""What model.depth did to one run (docs/training.md, One knob): each derived key's value, whether
the rule derived it or it was given, and the rule's value; read off the composed config before it
is resolved (a derived key is still its `${gptlab.depth:...}` interpolation there), for the first
screen and metrics.json. Plain Python, no torch: the rules' refusals come before torch loads."""

import dataclasses
import re
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from gptlab.config.depth import DERIVED, RESOLVER, Rung
from gptlab.errors import ConfigError, raised_within


def is_derived(cfg: DictConfig, key: str) -> bool:
    """Whether `key` is still the rule's interpolation in the composed, unresolved `cfg`."""
    group, _, field = key.rpartition(".")
    node = OmegaConf.select(cfg, group) if group else cfg
    if not OmegaConf.is_dict(node) or field not in node:
        return False
    raw = OmegaConf.to_container(node, resolve=False)[field]
    rule = rf"\$\{{{re.escape(RESOLVER)}:{re.escape(key)}(,[^}}]*)?\}}"
    return isinstance(raw, str) and re.fullmatch(rule, raw.replace(" ", "")) is not None


class Row(NamedTuple):
    key: str
    value: Any  # as the run has it
    derived: bool  # the rule's (else given)
    rule: Any  # the rule's value (None where it cannot apply to what was given)


@dataclasses.dataclass(frozen=True)
class Knob:
    """What model.depth did to one run: each derived key's Row, and the processes its rules
    split the batch over (`ranks`: None without a depth, which has no rows)."""

    rows: tuple[Row, ...] = ()
    ranks: int | None = None

    def record(self) -> dict:
        """As metrics.json keeps them: {key: {value, rule, derived}}."""
        return {r.key: {"value": r.value, "rule": r.rule, "derived": r.derived} for r in self.rows}

    def screen_lines(self) -> list[str]:
        """The first screen's lines: what the depth derived, and what was given instead."""
        if not self.rows:
            return []
        shown = [f"{r.key}={shown_value(r.value)}" for r in self.rows if r.derived]
        lines = [
            f"One knob: model.depth derived {', '.join(shown) or 'nothing'} (docs/training.md)"
        ]
        for r in self.rows:
            if not r.derived:
                lines.append(
                    f"  {r.key}={r.value} given: it wins over the rule's {shown_value(r.rule)}"
                )
        return lines


def shown_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def provenance(cfg: DictConfig) -> Knob:
    """With a depth: each derived key's Row, from the composed config before it is resolved; an
    empty Knob without a depth. ConfigError where a rule cannot apply (depth 0, a ratio of -1, a
    budget under one step): before any data or torch."""
    if OmegaConf.select(cfg, "model.depth") is None:
        return Knob()
    rung = Rung(cfg)
    rows = []
    for key in DERIVED:
        try:
            value = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        except Exception as e:  # a rule's ConfigError, raised inside OmegaConf's resolution
            raise (raised_within(e) or e) from None
        here = is_derived(cfg, key)
        rows.append(Row(key, value, here, value if here else rule_or_none(rung, key)))
    return Knob(tuple(rows), rung.ranks)


def rule_or_none(rung: Rung, key: str) -> Any:
    """The rule's value of a given key; None where the rule cannot apply (no budget buys a step
    of the given batch, say): the given value stands."""
    try:
        return rung.value(key)
    except ConfigError:
        return None
