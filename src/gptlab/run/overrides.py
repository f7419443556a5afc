"""Hydra's override grammar as gptlab writes and reads it: a value is written so that Hydra reads
back exactly that literal (`${` escaped, in quotes too)."""

import re
from typing import Any

NOT_REPLAYED = ("resume", "ckpt_path")  # how a run was started, not what it is


def override_key(override: str) -> str:
    """`+model.x=1` -> `model.x`"""
    return split_override(override)[0]


def split_override(override: str) -> tuple[str, str]:
    """`+model.x=1` -> (`model.x`, `1`): the key without its `+`/`~`, and the value as written."""
    key, _, value = str(override).partition("=")
    return key.lstrip("+~"), value


def escape_interpolation(text: str) -> str:
    """`text` with each `${` escaped (backslashes before it doubled): it reads back as itself."""
    return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", str(text))


def quote(text: str) -> str:
    """`text` single-quoted so Hydra reads back `text` (quotes, backslashes, `${` escaped)."""
    text = escape_interpolation(text)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return f"'{text}'"


def as_override(key: str, value: Any) -> str:
    """`key=value` for a plain value (a number, a bool, None or a string)."""
    if isinstance(value, bool) or value is None:
        return f"{key}={'null' if value is None else str(value).lower()}"
    return f"{key}={quote(value) if isinstance(value, str) else value}"


def short_label(overrides: list[str], sep: str = ",") -> str:
    """Overrides as a person tells runs apart: `model.num_heads=2 model.d_model=64` ->
    `heads=2,d_model=64`; the whole key where two would read alike."""
    pairs = [split_override(o) for o in overrides]
    short = [key.rsplit(".", 1)[-1].removeprefix("num_") for key, _ in pairs]
    return sep.join(
        f"{name if short.count(name) == 1 else key}={value}"
        for (key, value), name in zip(pairs, short, strict=True)
    )
