"""How gptlab writes a file: whole, under a temporary name renamed over the target (a kill leaves
the old file or the new one, never half of one, and a link there is replaced, not followed),
following the umask. Where it may write is gptlab.run.place's to decide."""

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def umask() -> int:
    """The process's umask, read where Linux reports it (os.umask would change it for a moment,
    for every thread); elsewhere set and put back at once."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """A temporary file beside `path`, renamed over it when the block ends without an error."""
    path = Path(path)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(handle, 0o666 & ~umask())
        with os.fdopen(handle, mode) as f:
            yield f
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # nothing half-written stays behind


def make_dirs(path: Path) -> list[Path]:
    """`path` (absolute) and its missing parents made: the folders made, oldest first."""
    made = []
    for folder in reversed([p for p in (path, *path.parents) if not os.path.lexists(p)]):
        with contextlib.suppress(FileExistsError):  # another process's meanwhile
            os.mkdir(folder)
            made.append(folder)
    return made


def write_text(path: str | Path, text: str) -> None:
    with atomic(path) as f:
        f.write(text)


def as_json(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"
