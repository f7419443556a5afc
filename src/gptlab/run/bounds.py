"""What a file another person could have written may ask of this machine, bounded before
anything is allocated for it (the bounds: docs/security.md)."""

import os
import zipfile
from pathlib import Path
from typing import Any

from gptlab import files
from gptlab.errors import ConfigError

MAX_NODES = 1_000_000  # values a checkpoint's plain part may hold (dicts, lists, numbers, ...)
MAX_DEPTH = 64


def not_a_checkpoint(path: str | Path, why: str) -> ConfigError:
    return ConfigError(
        f"ckpt_path: '{path}' is not a checkpoint gptlab can read: {why}. Give one saved by "
        "gptlab-train (a run's checkpoints/last.ckpt or best.ckpt)."
    )


def check_archive(path: str | Path) -> None:
    """Before torch reads a byte: a regular file, a zip of stored members within its size."""
    try:
        with files.open_regular(path, follow=True) as f:
            size = os.fstat(f.fileno()).st_size
            with zipfile.ZipFile(f) as archive:
                members = archive.infolist()
    except FileNotFoundError:
        raise ConfigError(f"ckpt_path: '{path}' does not exist.") from None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as e:
        why = f"it is truncated or not a checkpoint at all (not a whole zip archive: {e})"
        raise not_a_checkpoint(path, why) from None
    if any(m.compress_type != zipfile.ZIP_STORED for m in members):
        raise not_a_checkpoint(path, "it holds compressed members, which torch.save never writes")
    if sum(m.file_size for m in members) > size:
        raise not_a_checkpoint(path, "its members declare more bytes than the file holds")


def check_plain_size(value: Any, path: str | Path) -> None:
    """Besides the tensors' data: at most MAX_NODES values (each use counted), MAX_DEPTH deep."""
    import torch

    todo, count = [(value, 0)], 0
    while todo:
        node, level = todo.pop()
        count += 1
        if count > MAX_NODES or level > MAX_DEPTH:
            raise not_a_checkpoint(path, "its settings are nested too deeply or hold too much")
        if isinstance(node, dict):
            todo += [(v, level + 1) for item in node.items() for v in item]
        elif isinstance(node, list | tuple) and not isinstance(node, torch.Size):
            todo += [(v, level + 1) for v in node]


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (Linux's MemAvailable), None where unknown."""
    for line in (files.read_bytes("/proc/meminfo") or b"").decode().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def memory_needed(model, batch_size: int = 1) -> int:
    """An estimate of a GPT's bytes (on the meta device): weights, tables, one forward pass."""
    c = model.config
    tensors = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    activations = batch_size * c.context_length * (c.vocab_size + 16 * c.d_model * c.num_blocks)
    if c.attention == "manual":
        activations += batch_size * c.num_heads * c.context_length**2 * c.num_blocks
    return tensors + 4 * activations


def check_memory(model, batch_size: int, where: str) -> None:
    needed, available = memory_needed(model, batch_size), available_memory()
    if available is not None and needed > available:
        c = model.config
        raise ConfigError(
            f"{where}: the model needs about {needed / 2**30:,.1f} GiB (d_model {c.d_model}, "
            f"{c.num_blocks} blocks, context_length {c.context_length}, vocabulary "
            f"{c.vocab_size:,}, batch {batch_size}), more than the {available / 2**30:,.1f} GiB "
            "this machine has available. Make it smaller (model.d_model, model.num_blocks, "
            "data.context_length, data.batch_size) or run it on a larger machine."
        )
