"""The one home of file input and output, so its rules (docs/security.md) hold by
construction: writes whole, never through a link; deletes of what this process created;
bounded reads of regular files. Where a tool may write is gptlab.run.place's to decide."""

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import yaml

CHUNK = 1 << 20
MAX_BYTES = 64 << 20  # a run's JSON or YAML file: a manifest, metrics.json, a saved config
MAX_DEPTH = 32  # gptlab's own files are at most 5 deep
CREATED: list[Path] = []  # the folders this process created, first to last
ADOPTED: list[Path] = []  # empty folders it was given: what they hold is this process's


def umask() -> int:
    """The process's umask (read without changing it where Linux reports it)."""
    status = read_bytes("/proc/self/status") or b""
    for line in status.decode(errors="replace").splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: set and put back at once
    os.umask(mask)
    return mask


def make_dir(path: str | Path) -> Path:
    """Create `path` (a link on the way is not resolved away) and its missing parents, recording
    each; FileExistsError when `path` exists already: it is someone else's."""
    path = Path(os.path.abspath(path))
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    if path not in missing:
        raise FileExistsError(f"'{path}' exists")
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
            CREATED.append(folder)
        except FileExistsError:  # a parent another process made meanwhile is not ours
            if folder == path:
                raise
    return path


def adopt(path: str | Path) -> None:
    """An empty folder (not a link) given to this process: what appears in it is its own."""
    path = Path(os.path.abspath(path))
    if not os.path.islink(path) and path.is_dir() and not any(path.iterdir()):
        ADOPTED.append(path)


def remove_created(path: str | Path) -> None:
    """Remove `path` and the parents it leaves empty when this process created them; empty it
    when adopted; leave anything else as it is."""
    path = Path(os.path.abspath(path))
    if os.path.islink(path) or not path.is_dir():
        return
    if path in ADOPTED:
        for entry in path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        return
    if path not in CREATED:
        return
    shutil.rmtree(path)
    CREATED.remove(path)
    for parent in path.parents:
        if parent not in CREATED or any(parent.iterdir()):
            break
        parent.rmdir()
        CREATED.remove(parent)


def temporary_name(path: Path) -> str:
    """The prefix of `path`'s temporary files: `.<name>.`; they end in `.tmp`."""
    return f".{path.name}."


@contextlib.contextmanager
def atomic(
    path: str | Path,
    mode: str = "w",
    before_replace: Callable[[Path], None] | None = None,
    on_create: Callable[[Path], None] | None = None,
) -> Iterator[IO]:
    """A temporary file beside `path` (`on_create(tmp)` first), renamed over it when the block
    ends without an error; `before_replace(tmp)` runs once it is whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_name(path), suffix=".tmp")
    try:
        os.fchmod(handle, 0o666 & ~umask())
        if on_create is not None:
            on_create(Path(tmp))
        with os.fdopen(handle, mode) as f:
            yield f
        if before_replace is not None:
            before_replace(Path(tmp))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # nothing half-written stays behind


def write_text(path: str | Path, text: str) -> None:
    with atomic(path, "w") as f:
        f.write(text)


def write_json(path: str | Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")


def save_figure(fig, path: str | Path, **kwargs) -> None:
    with atomic(path, "wb") as f:
        fig.savefig(f, format="png", **kwargs)


def open_regular(path: str | Path, follow: bool = False) -> IO[bytes]:
    """`path` opened if a regular file, else OSError (no FIFO waited on; links only if `follow`)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    handle = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise OSError(f"'{path}' is not a regular file")
    return os.fdopen(handle, "rb")


def read_bytes(path: str | Path, limit: int = MAX_BYTES) -> bytes | None:
    """A regular file's bytes; None when it is missing, unreadable, not one, or over `limit`."""
    try:
        with open_regular(path) as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def depth(data: Any) -> int:
    """How deeply lists and dicts nest in `data` (without recursion; only the containers are
    visited: a tokenizer.json's 10**5 strings cost no step each)."""
    if not isinstance(data, dict | list):
        return 0
    deepest, todo = 0, [(data, 1)]
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        children = node.values() if isinstance(node, dict) else node
        todo += [(child, level + 1) for child in children if isinstance(child, dict | list)]
    return deepest


class PlainLoader(yaml.SafeLoader):
    """YAML's safe loader without aliases: what a file holds is bounded by its size."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("aliases are not read")
        return super().compose_node(parent, index)


def read_plain(path: str | Path, parse: Callable[[bytes], Any], errors: tuple) -> Any:
    """A file parsed as plain data; None when read_bytes gives none, too deep, or unparsable."""
    raw = read_bytes(path)
    try:
        data = None if raw is None else parse(raw)
    except (*errors, RecursionError):
        return None
    return data if depth(data) <= MAX_DEPTH else None


def read_json(path: str | Path) -> Any:
    return read_plain(path, json.loads, (ValueError,))


def read_yaml(path: str | Path) -> Any:
    """Safe: no tags, no objects, no aliases."""
    return read_plain(path, lambda raw: yaml.load(raw, Loader=PlainLoader), (yaml.YAMLError,))  # noqa: S506


def sha256_of(path: str | Path) -> str:
    """The sha256 of a regular file's content, read in chunks (OSError for anything else)."""
    digest = hashlib.sha256()
    with open_regular(path) as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def append_only(filename: str | Path) -> IO[str]:
    """`filename` opened to append to, created if missing: a regular file of one link only."""
    handle = os.open(filename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(handle)
        raise OSError(f"'{filename}' is a link or not a regular file: gptlab does not append to it")
    return os.fdopen(handle, "a", encoding="utf-8")


class LogFile(logging.StreamHandler):
    """A log file appended to (Hydra's job log, a spawned DDP process's) by append_only."""

    def __init__(self, filename, mode="a", encoding=None, delay=False, errors=None):
        super().__init__(append_only(filename))
        self.baseFilename = os.path.abspath(filename)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.flush()
        self.stream.close()
        super().close()
