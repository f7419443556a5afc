"""A run's recorded settings, read as data (what resume= re-applies and gptlab-eval reads):
only installed options and literals of plain keys, never where it writes (docs/security.md)."""

import importlib.resources
import sys
from typing import Any

from gptlab.run.overrides import KEY, literal, sweep_literal

# Keys that say where a run writes or downloads: the run's own directory decides, not its files.
WHERE = ("output_dir", "root_dir", "data_dir", "cache_dir", "dirpath", "save_dir")
WHERE_KEYS = (*WHERE, "default_root_dir", "tracking_uri", "log_dir")
# Groups whose keys are never replayed (the group's choice is): where results and logs go.
NOT_REPLAYED_GROUPS = ("paths", "logger", "hydra")
NOT_REPLAYED = ("resume", "ckpt_path")  # how the run was started, not what it is


def installed_options(group: str) -> set[str]:
    """The options of a config group as gptlab ships them (conf/<group>/<option>.yaml)."""
    folder = importlib.resources.files("gptlab.conf") / group
    if not folder.is_dir():
        return set()
    return {p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")}


def replay_override(override, sweep: bool = False) -> tuple[str | None, str | None]:
    """(the override re-emitted, None) when it may be re-applied; (None, it) when dropped;
    (None, None) for how the run was started (resume, ckpt_path)."""
    if not isinstance(override, str) or "=" not in override:
        return None, str(override)
    key, raw = override.split("=", 1)  # the key as written: `+key` and `~key` are refused
    if key in NOT_REPLAYED:
        return None, None
    parts = key.split(".")
    grouped = len(parts) > 1 and parts[0] in NOT_REPLAYED_GROUPS or key in ("paths", "hydra")
    if not KEY.fullmatch(key) or parts[-1] in WHERE_KEYS or grouped:
        return None, override
    if len(parts) == 1 and installed_options(key):  # a group: installed options, e.g. `[a,b]`
        choices = raw[1:-1].split(",") if raw.startswith("[") and raw.endswith("]") else [raw]
        known = all(c in installed_options(key) for c in choices)
        return (f"{key}={raw}", None) if known else (None, override)
    value = sweep_literal(raw) if sweep else literal(raw)
    return (None, override) if value is None else (f"{key}={value}", None)


def replayable(overrides, source, sweep: bool = False) -> list[str]:
    """The recorded overrides that pass `replay_override`; the dropped ones named on stderr."""
    kept, dropped = [], []
    for override in overrides if isinstance(overrides, list) else []:
        good, bad = replay_override(override, sweep)
        if good is not None:
            kept.append(good)
        elif bad is not None:
            dropped.append(bad)
    if dropped:
        print(
            f"gptlab-train: resume: not re-applying {len(dropped)} setting(s) recorded in "
            f"{source}: only installed options and literal values of existing keys are "
            "re-applied, never `_target_`, `hydra.*`, `logger.*` or where the run writes: "
            f"{' '.join(dropped)}. Give them on the command line if you trust them.",
            file=sys.stderr,
        )
    return kept


def literal_node(node, where: str) -> tuple[dict, list[str]]:
    """(kept, dropped) settings of a saved config node: literals kept, nothing resolved."""
    kept, dropped = {}, []
    for key, value in (node if isinstance(node, dict) else {}).items():
        plain = value is None or isinstance(value, (bool, int, float))
        text = isinstance(value, str) and "${" not in value
        if KEY.fullmatch(str(key)) and (plain or text):
            kept[key] = value
        else:
            dropped.append(f"{where}.{key}")
    return kept, dropped


def saved_value(cfg: Any, key: str, default: Any = None) -> Any:
    """A literal value at a dotted key of a saved config (data, never resolved), else `default`."""
    value = cfg
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    plain = isinstance(value, (int, float, bool))
    text = isinstance(value, str) and "${" not in value
    return value if plain or text else default
