"""A mixture of named sources (docs/data.md): its checks, its weights by step, and which source each
training window comes from. Everything here is a pure function of the config, the step and the
sources' train sizes, so a resumed run, a requeued job and every DDP rank agree on it.

Which source window n of a rank's stream (n = step * batch_size + j) comes from: the source whose
interval of the cumulative weights holds u_n = frac(n * 0.618...) (a golden-ratio Weyl sequence, in
32-bit integers). Its points spread evenly, so every block of windows, a batch included, holds each
source's share up to about one window, and a source of weight 1 gets every window."""

import bisect
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gptlab.errors import ConfigError

# the keys a source of a mixture sets for itself (the others are data's own, shared)
SOURCE_KEYS = (
    "url",
    "path",
    "sha256",
    "name",
    "split",
    "text_field",
    "file_name",
)  # a source's own
PROPORTIONAL = "proportional"  # weights in proportion to the sources' train tokens
GOLDEN = 0x9E3779B9  # 2**32 / the golden ratio, odd: u_n = (n * GOLDEN mod 2**32) / 2**32
NAME = re.compile(r"[A-Za-z0-9_-]+")  # a source's name is part of its metrics' names
AVERAGES = ("micro", "macro")  # val/micro/loss, val/macro/loss: no source may take their names


@dataclass(frozen=True)
class Stage:
    """From step `start` on (until the next stage), each source's weight, or PROPORTIONAL."""

    start: int
    weights: dict | str


def check_mixture(settings) -> None:
    """A mixture's sources and weights, checked before any file is read or any text tokenized."""
    sources = settings.sources
    if not isinstance(sources, Mapping) or not sources:
        raise ConfigError(
            f"data.sources={sources!r}: a mixture names its sources, e.g. data.sources="
            "{book: {path: book.txt}, other: {path: other.txt}}; null for a single source."
        )
    for key in ("path", "name"):
        if getattr(settings, key):
            raise ConfigError(
                f"data.{key}={getattr(settings, key)!r} names a single source, and data.sources "
                f"a mixture. Give each source its own data.sources.<source>.{key}, and set "
                f"data.{key}=null."
            )
    for source, given in sources.items():
        where = f"data.sources.{source}"
        if not isinstance(source, str) or not NAME.fullmatch(source):
            raise ConfigError(
                f"{where}: a source's name is letters, digits, _ and - only (it names the "
                "source's metrics, val/<source>/loss). Rename it."
            )
        if source in AVERAGES:
            raise ConfigError(
                f"{where}: '{source}' names one of the averages over the sources "
                f"(val/{source}/loss), so a source cannot take it. Rename the source."
            )
        if not isinstance(given, Mapping):
            raise ConfigError(f"{where}={given!r}: give its settings, e.g. {{path: f.txt}}.")
        unknown = sorted(set(given) - set(SOURCE_KEYS))
        if unknown:
            raise ConfigError(
                f"{where}.{unknown[0]}: a source has no such setting; it takes "
                f"{', '.join(SOURCE_KEYS)} (the shared ones, such as encoding or batch_size, are "
                "data's own)."
            )
        if not any(given.get(key) for key in ("url", "path", "name")):
            raise ConfigError(
                f"{where}: the source names no text. Give it a url (with its sha256), a path (a "
                "file, folder, glob, JSONL or Parquet) or a name (a Hugging Face dataset); as "
                "for a single source, name wins over path, and path over url."
            )
    stages(settings.weights, list(sources))


def stages(weights, names: list[str]) -> list[Stage]:
    """data.weights as stages: null or `proportional`, {source: weight}, or a list of
    {start: step, weights: ...} from step 0 on, starts rising (levanter's staged weights)."""
    if weights is None or isinstance(weights, str | Mapping):
        return [Stage(0, checked_weights(weights, names, "data.weights"))]
    if not isinstance(weights, Sequence) or not weights:
        raise ConfigError(
            f"data.weights={weights!r}: give {{source: weight}}, `proportional`, or stages "
            "[{start: 0, weights: {...}}, {start: 1000, weights: {...}}]."
        )
    found = []
    for i, stage in enumerate(weights):
        where = f"data.weights[{i}]"
        if not isinstance(stage, Mapping) or set(stage) != {"start", "weights"}:
            raise ConfigError(
                f"{where}={stage!r}: a stage is {{start: <step>, weights: {{source: weight}}}}."
            )
        start = stage["start"]
        previous = found[-1].start if found else None
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ConfigError(f"{where}.start={start!r}: a stage starts at a step, 0 or more.")
        if (previous is None and start != 0) or (previous is not None and start <= previous):
            raise ConfigError(
                f"{where}.start={start}: the first stage starts at step 0 and each later one "
                f"after the one before it{'' if previous is None else f' (step {previous})'}."
            )
        found.append(Stage(start, checked_weights(stage["weights"], names, f"{where}.weights")))
    return found


def checked_weights(weights, names: list[str], where: str) -> dict | str:
    """{source: weight} (a source left out weighs 0: validated, never trained on), or
    PROPORTIONAL."""
    if weights is None or weights == PROPORTIONAL:
        return PROPORTIONAL
    if not isinstance(weights, Mapping):
        raise ConfigError(
            f"{where}={weights!r}: give {{source: weight}} or `{PROPORTIONAL}` (each source in "
            "proportion to its train tokens)."
        )
    for source, weight in weights.items():
        if source not in names:
            raise ConfigError(
                f"{where}.{source}: there is no source '{source}' in this mixture; its sources are "
                f"{', '.join(names)} (data.sources)."
            )
        number = isinstance(weight, int | float) and not isinstance(weight, bool)
        if not number or not math.isfinite(weight) or weight < 0:
            raise ConfigError(
                f"{where}.{source}={weight!r}: a weight is a finite number, 0 or more (0: the "
                "source is validated, never trained on)."
            )
    if not any(weights.values()):
        raise ConfigError(
            f"{where}={dict(weights)}: every weight is 0, so no source could be trained on. Give "
            "at least one source a positive weight."
        )
    return {name: float(weights.get(name, 0.0)) for name in names}


class Mixture:
    """The sources' shares by step, once their train sizes are known."""

    def __init__(self, weights, train_tokens: dict[str, int]):
        self.names = list(train_tokens)
        self.train_tokens = train_tokens
        sizes = np.array([train_tokens[n] for n in self.names], dtype=np.float64)
        self.starts = []
        self.shares = []  # [stage] -> [source] weights that sum to 1
        for stage in stages(weights, self.names):
            raw = sizes if stage.weights == PROPORTIONAL else [stage.weights[n] for n in self.names]
            raw = np.asarray(raw, dtype=np.float64)
            self.starts.append(stage.start)
            self.shares.append(raw / raw.sum())
        self.bounds = [np.cumsum(shares).tolist() for shares in self.shares]  # [stage] -> [source]

    def shares_at(self, step: int) -> np.ndarray:
        """The sources' shares at `step`: the last stage started by then."""
        return self.shares[np.searchsorted(self.starts, step, side="right") - 1]

    def counts(self, step: int, batch_size: int) -> list[int]:
        """[source] windows in batch `step` (they sum to batch_size): window n goes to the source
        whose interval of the cumulative shares holds u_n, the module docstring's sequence. Plain
        Python: for a batch of windows it is quicker than numpy's calls."""
        bounds = self.bounds[bisect.bisect_right(self.starts, step) - 1]
        total = bounds[-1]
        counts = [0] * len(bounds)
        for n in range(step * batch_size, (step + 1) * batch_size):
            u = (n * GOLDEN) % 2**32 / 2**32
            # the first bound above u * total: a source of weight 0 has an empty interval
            counts[bisect.bisect_right(bounds, u * total)] += 1
        return counts

    def epochs(self, steps: int, tokens_per_step: int) -> dict[str, float]:
        """Epochs of each source's train split that `steps` steps of `tokens_per_step` train
        tokens (over every rank) take: tokens x share / the source's train tokens."""
        ends = [*self.starts[1:], math.inf]
        tokens = np.zeros(len(self.names))
        for start, end, shares in zip(self.starts, ends, self.shares, strict=True):
            tokens += max(0, min(steps, end) - start) * tokens_per_step * shares
        seen = dict(zip(self.names, tokens, strict=True))
        return {n: float(seen[n] / max(self.train_tokens[n], 1)) for n in self.names}


def of_source(message: str, source: str | None) -> str:
    """A single source's error said of a mixture's source: data.path -> data.sources.<it>.path."""
    if source is None:
        return message
    keys = "|".join(SOURCE_KEYS)
    message, named = re.subn(rf"\bdata\.({keys})\b", rf"data.sources.{source}.\1", message)
    return message if named else f"Source '{source}' (data.sources.{source}): {message}"


def union_vocabulary(stores: dict, vocab_mode: str) -> tuple[list[int] | None, dict]:
    """A mixture's one vocabulary and, per source, its store's ids -> the vocabulary's: compact
    stores keep the ids each source uses, and the mixture's vocabulary is their union."""
    if vocab_mode != "compact":  # tiktoken's ids, or a checkpoint's vocabulary: one id space
        first = next(iter(stores.values()))
        return first.meta["vocab"], dict.fromkeys(stores)
    kept = {source: np.asarray(store.meta["vocab"]) for source, store in stores.items()}
    union = np.unique(np.concatenate(list(kept.values())))
    return union.tolist(), {source: np.searchsorted(union, ids) for source, ids in kept.items()}
