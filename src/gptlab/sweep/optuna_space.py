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


def choices(override: Override) -> CategoricalDistribution:
    values = list(override.sweep_iterator(transformer=Transformer.encode))
    for value in values:
        if not isinstance(value, (str, int, float, bool, type(None))):
            raise ConfigError(
                f"hydra.sweeper.params.{override.get_key_element()}: a choice takes numbers, "
                f"text, booleans or null; got {value!r}."
            )
    return CategoricalDistribution(values)


def from_range(override: Override) -> BaseDistribution:
    """range(start, stop, step): stop excluded, as Hydra's grid sweeps read it."""
    value = override.value()
    if value.shuffle:
        return choices(override)
    count = math.ceil((value.stop - value.start) / value.step)
    last = value.start + (count - 1) * value.step
    if any(isinstance(v, float) for v in (value.start, value.stop, value.step)):
        return FloatDistribution(value.start, last, step=value.step)
    return IntDistribution(int(value.start), int(last), step=int(value.step))


def from_interval(override: Override) -> BaseDistribution:
    value = override.value()
    log = "log" in value.tags
    if isinstance(value.start, int) and isinstance(value.end, int):
        return IntDistribution(value.start, value.end, log=log)
    return FloatDistribution(float(value.start), float(value.end), log=log)


def distribution(override: Override) -> BaseDistribution | None:
    """The override's distribution; None for a plain value (the same in every trial)."""
    if not override.is_sweep_override():
        return None
    if override.is_choice_sweep():
        return choices(override)
    if override.is_range_sweep():
        return from_range(override)
    if override.is_interval_sweep():
        return from_interval(override)
    raise ConfigError(
        f"hydra.sweeper.params.{override.get_key_element()}: the Optuna sweeper takes choice(), "
        "range(), interval() and tag(log, interval()); not a glob."
    )


def search_space(arguments: list[str]) -> tuple[dict[str, BaseDistribution], list[str]]:
    """The swept keys' distributions, and the fixed overrides every trial's job gets."""
    space, fixed = {}, []
    for override in OverridesParser.create().parse_overrides(arguments):
        key = override.get_key_element()
        found = distribution(override)
        space.pop(key, None)  # a later override of the same key wins, as in Hydra
        fixed = [f for f in fixed if f.split("=", 1)[0] != key]
        if found is None:
            fixed.append(override.input_line)
        else:
            space[key] = found
    return space, fixed


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
