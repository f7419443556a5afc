"""A run's recorded settings, read as data: what resume= re-applies and what gptlab-eval reads.

A run directory may come from anyone, so nothing read from it goes through Hydra's override
grammar or OmegaConf's resolvers as it stands. Each recorded setting is checked and re-emitted:
a group choice must name an installed option; a value must be a literal (a number, true/false,
null or a plain string, no `${`); a key must be a plain dotted name (no `_target_` or other `_`
keys, no `+` new keys, nothing under `hydra`); a key that says where the run writes is not taken
from the directory (the run continues in the directory itself). What is dropped is named in one
line on stderr."""

import importlib.resources
import re
import sys
from pathlib import Path
from typing import Any

import yaml

KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)*")
OPTION = re.compile(r"[A-Za-z0-9_-]+")
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
PLAIN = re.compile(r"[A-Za-z0-9_./:@+-]+")  # a string Hydra's grammar reads as itself, unquoted
KEYWORDS = ("true", "false", "null")
# Keys that say where a run writes or downloads: the run's own directory decides, not its files.
WHERE = ("output_dir", "root_dir", "data_dir", "cache_dir", "dirpath", "save_dir")
WHERE_KEYS = (*WHERE, "default_root_dir", "tracking_uri", "log_dir")
NOT_REPLAYED = ("resume", "ckpt_path")  # how the run was started, not what it is


def installed_options(group: str) -> set[str]:
    """The options of a config group as gptlab ships them (conf/<group>/<option>.yaml)."""
    folder = importlib.resources.files("gptlab.conf") / group
    if not folder.is_dir():
        return set()
    return {p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")}


def quote(text: str) -> str:
    """`text` as a quoted literal for Hydra's grammar (callers refuse backslashes and `${`)."""
    return "'" + text.replace("'", "\\'") + "'"


def literal(raw: str) -> str | None:
    """A recorded value re-emitted so that Hydra's grammar reads it as that literal, or None when
    it is not a number, true/false/null or a plain string (lists, dicts, `${...}`, functions)."""
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        text = raw[1:-1]
        if raw[0] in text or "\\" in text or "${" in text:
            return None
        return quote(text)
    if NUMBER.fullmatch(raw) or raw.lower() in KEYWORDS or PLAIN.fullmatch(raw):
        return raw
    return None


def sweep_literal(raw: str) -> str | None:
    """A sweep's value: a literal, or a comma-separated list of literals (`1,2,4`)."""
    single = literal(raw)
    if single is not None or "," not in raw:
        return single
    parts = [literal(part) for part in raw.split(",")]
    return None if None in parts else ",".join(parts)


def checked(override, sweep: bool = False) -> tuple[str | None, str | None]:
    """(the override re-emitted, None) when it may be re-applied; (None, it) when it is dropped;
    (None, None) for what says how the run was started (resume, ckpt_path)."""
    if not isinstance(override, str) or "=" not in override:
        return None, str(override)
    key, raw = override.split("=", 1)
    if key in NOT_REPLAYED:
        return None, None
    if not KEY.fullmatch(key) or key.split(".")[0] == "hydra" or key.split(".")[-1] in WHERE_KEYS:
        return None, override
    if key == "paths" or key.startswith("paths."):
        return None, override
    if "." not in key and installed_options(key):  # a group: installed options, e.g. `[a,b]`
        choices = raw[1:-1].split(",") if raw.startswith("[") and raw.endswith("]") else [raw]
        known = all(c in installed_options(key) for c in choices)
        return (f"{key}={raw}", None) if known else (None, override)
    value = sweep_literal(raw) if sweep else literal(raw)
    return (None, override) if value is None else (f"{key}={value}", None)


def replayable(overrides, source, sweep: bool = False) -> list[str]:
    """The recorded overrides that pass `checked`, re-emitted; the dropped ones named on stderr."""
    kept, dropped = [], []
    for override in overrides if isinstance(overrides, list) else []:
        good, bad = checked(override, sweep)
        if good is not None:
            kept.append(good)
        elif bad is not None:
            dropped.append(bad)
    if dropped:
        print(
            f"gptlab-train: resume: not re-applying {len(dropped)} setting(s) recorded in "
            f"{source}: only installed options and literal values of existing keys are "
            "re-applied, never `_target_`, `hydra.*` or where the run writes: "
            f"{' '.join(dropped)}. Give them on the command line if you trust them.",
            file=sys.stderr,
        )
    return kept


def literal_node(node, where: str) -> tuple[dict, list[str]]:
    """The literal settings of a saved config node (a dict from yaml.safe_load): (kept, dropped).
    An interpolation, a nested node or a `_` key is dropped: it is never resolved."""
    kept, dropped = {}, []
    for key, value in (node if isinstance(node, dict) else {}).items():
        plain = value is None or isinstance(value, (bool, int, float))
        text = isinstance(value, str) and "${" not in value
        if KEY.fullmatch(str(key)) and (plain or text):
            kept[key] = value
        else:
            dropped.append(f"{where}.{key}")
    return kept, dropped


def read_yaml(path: Path) -> Any:
    """A YAML file of a run directory as plain data (safe_load: no tags, no objects), or None."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None


def saved_value(cfg: Any, key: str, default: Any = None) -> Any:
    """A literal value at a dotted key of a saved config (data, never resolved), else `default`."""
    value = cfg
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    plain = isinstance(value, (int, float, bool)) and value is not None
    text = isinstance(value, str) and "${" not in value
    return value if plain or text else default
