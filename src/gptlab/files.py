"""The one home of file input and output, for run files, caches and reports alike.

Every file gptlab writes is written whole or not at all: a fresh temporary file beside the target,
renamed over it once complete, so a kill at any moment leaves the previous file as it was. The
temporary file is created for this write alone (never opened through a link planted under its
name) and its mode follows the user's umask, like a file `open()` creates. Reads take plain
data only (JSON, YAML's safe loader) and never follow a symlink."""

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import yaml

CHUNK = 1 << 20


def umask() -> int:
    """The process's umask (read without changing it where Linux reports it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere: set and put back at once
    os.umask(mask)
    return mask


def temporary_name(path: Path) -> str:
    """The prefix of `path`'s temporary files: `.<name>.`; stale ones match `.<name>.*.tmp`."""
    return f".{path.name}."


@contextlib.contextmanager
def atomic(
    path: str | Path, mode: str = "w", before_replace: Callable[[Path], None] | None = None
) -> Iterator[IO]:
    """A file object to write `path` through: a new temporary file in the same folder, renamed
    over `path` when the block ends without an error (a link at `path` is replaced, its target
    left as it was). `before_replace(tmp)` runs once the file is whole, before the rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_name(path), suffix=".tmp")
    try:
        os.fchmod(handle, 0o666 & ~umask())
        with os.fdopen(handle, mode) as f:
            yield f
        if before_replace is not None:
            before_replace(Path(tmp))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # nothing half-written stays behind


def write_text(path: str | Path, text: str, before_replace=None) -> None:
    with atomic(path, "w", before_replace) as f:
        f.write(text)


def write_json(path: str | Path, data: Any, before_replace=None) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n", before_replace)


def save_figure(fig, path: str | Path, **kwargs) -> None:
    """A matplotlib figure as a PNG file, written whole like every other file."""
    with atomic(path, "wb") as f:
        fig.savefig(f, format="png", **kwargs)


def read_bytes(path: str | Path) -> bytes | None:
    """The file's bytes; None when it is missing, unreadable or a symlink."""
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(handle, "rb") as f:
        return f.read()


def read_json(path: str | Path) -> Any:
    """A JSON file as plain data; None when it is missing, a link, or not JSON."""
    raw = read_bytes(path)
    try:
        return None if raw is None else json.loads(raw)
    except ValueError:
        return None


def read_yaml(path: str | Path) -> Any:
    """A YAML file as plain data (safe_load: no tags, no objects); None when it is missing, a
    link, or not YAML."""
    raw = read_bytes(path)
    try:
        return None if raw is None else yaml.safe_load(raw)
    except yaml.YAMLError:
        return None


def sha256_of(path: str | Path) -> str:
    """The sha256 of a file's content, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


class LogFile(logging.FileHandler):
    """A log file appended to, never through a link: a link planted under its name is replaced by
    a file of its own before it is opened (Hydra's job log and a spawned DDP process's)."""

    def __init__(self, filename, mode="a", encoding=None, delay=False, errors=None):
        if os.path.islink(filename):
            os.unlink(filename)
        super().__init__(filename, mode, encoding, delay, errors)
