"""The search space: Hydra's sweep grammar (`choice`, `range`, `interval`, `tag(log, ...)`), parsed
with Hydra's own override parser, as Optuna distributions; plain overrides stay fixed."""

import math
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from gptlab.errors import ConfigError


def distribution(override: Override) -> BaseDistribution | None:
    """The override's distribution; None for a plain value (the same in every trial). A range's
    stop is excluded, as Hydra's grid sweeps read it."""
    key, value = override.get_key_element(), override.value()
    if not override.is_sweep_override():
        return None
    if override.is_interval_sweep():
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    if override.is_range_sweep() and not value.shuffle:
        count = math.ceil((value.stop - value.start) / value.step)
        last = value.start + (count - 1) * value.step
        if any(isinstance(v, float) for v in (value.start, value.stop, value.step)):
            return FloatDistribution(value.start, last, step=value.step)
        return IntDistribution(int(value.start), int(last), step=int(value.step))
    if not (override.is_choice_sweep() or override.is_range_sweep()):
        raise ConfigError(
            f"hydra.sweeper.params.{key}: the Optuna sweeper takes choice(), range(), interval() "
            "and tag(log, interval()); not a glob."
        )
    values = list(override.sweep_iterator(transformer=Transformer.encode))
    for found in values:
        if not isinstance(found, (str, int, float, bool, type(None))):
            raise ConfigError(
                f"hydra.sweeper.params.{key}: a choice takes numbers, text, booleans or null; "
                f"got {found!r}."
            )
    return CategoricalDistribution(values)


def search_space(arguments: list[str]) -> tuple[dict[str, BaseDistribution], list[str]]:
    """The swept keys' distributions, and the fixed overrides every trial's job gets."""
    chosen = {}  # a later override of the same key wins, as in Hydra
    for override in OverridesParser.create().parse_overrides(arguments):
        chosen.pop(override.get_key_element(), None)
        chosen[override.get_key_element()] = distribution(override) or override.input_line
    space = {k: v for k, v in chosen.items() if not isinstance(v, str)}
    return space, [v for v in chosen.values() if isinstance(v, str)]


def grid(space: dict[str, BaseDistribution]) -> dict[str, list[Any]]:
    """Every value of each discrete distribution, for Optuna's GridSampler."""
    values = {}
    for name, found in space.items():
        if isinstance(found, CategoricalDistribution):
            values[name] = list(found.choices)
        elif found.step is not None and not found.log:
            count = int(round((found.high - found.low) / found.step)) + 1
            values[name] = [found.low + i * found.step for i in range(count)]
        else:
            raise ConfigError(
                f"hydra.sweeper.params.{name}: sampler=grid needs choice() or range(), "
                "not a continuous interval."
            )
    return values
