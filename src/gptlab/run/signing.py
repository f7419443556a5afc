"""The user's signing key, checked as OpenSSH checks a private key (docs/security.md), and a
manifest's signature: whoever lacks the key cannot make a directory look like the user's own."""

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

from gptlab import reader
from gptlab.errors import ConfigError
from gptlab.run import directory

KEY_FILE = "GPTLAB_KEY_FILE"


def refused(path: Path | str, reason: str, fix: str) -> ConfigError:
    return ConfigError(
        f"{KEY_FILE}: gptlab does not use the signing key '{path}': {reason}. {fix} (The key "
        "proves that a run directory is yours; a key others can read, write or carry along "
        "proves nothing.)"
    )


def key_file() -> Path:
    given = os.environ.get(KEY_FILE)
    if given:
        path = Path(given).expanduser()
        if not path.is_absolute():
            raise refused(given, "it is a relative path", f"Give {KEY_FILE} an absolute path.")
        return path
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "gptlab" / "key"


def check_key_place(path: Path) -> None:
    """Not inside a run or sweep directory (checked where the path resolves)."""
    run = directory.enclosing_run(path.parent)
    if run is not None:
        raise refused(
            path,
            f"it lies inside the run or sweep directory '{run}'",
            f"Move it out (e.g. to ~/.config/gptlab/key) and point {KEY_FILE} there.",
        )


def check_folders(path: Path) -> None:
    """OpenSSH's rule for the folders above a key, up to your home: each yours or root's, and
    none that group or others can write to (but a sticky one, as /tmp, above the key's own).
    Folders not made yet are skipped: checked before the key is made, and again when used."""
    home = Path.home()
    for i, folder in enumerate(path.parents):
        try:
            info = os.stat(folder)
        except FileNotFoundError:
            continue
        sticky = i > 0 and info.st_mode & stat.S_ISVTX
        if info.st_uid not in (0, os.getuid()):
            raise refused(
                path,
                f"its folder '{folder}' belongs to user id {info.st_uid}, who could swap the key",
                f"Keep it in a folder of yours (e.g. ~/.config/gptlab) and point {KEY_FILE} there.",
            )
        if info.st_mode & 0o022 and not sticky:
            raise refused(
                path,
                f"its folder '{folder}' can be written by others, who could swap the key",
                f"Keep it in a folder that only you can write (chmod go-w '{folder}').",
            )
        if folder == home:
            return


def check_key(path: Path) -> None:
    """OpenSSH's rules for a private key: a regular file of the user's, for the user alone."""
    check_folders(path)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise refused(path, "it is a symlink", f"Point {KEY_FILE} at the file itself.")
    if not stat.S_ISREG(info.st_mode):
        raise refused(path, "it is not a regular file", f"Point {KEY_FILE} at a key file.")
    if info.st_uid != os.getuid():
        raise refused(
            path, f"it belongs to user id {info.st_uid}, not to you", "Use a key of yours."
        )
    if info.st_nlink > 1:
        raise refused(
            path,
            f"it has {info.st_nlink} hard links, so it may be carried elsewhere",
            "Give the key one name only: make a new one (delete it; gptlab makes another).",
        )
    if info.st_mode & 0o077:
        raise refused(
            path,
            f"its mode {stat.filemode(info.st_mode)} lets group or others read or write it",
            f"Make it yours alone: chmod 600 '{path}'.",
        )


def create_key(path: Path) -> None:
    """A new random key, readable by this user only; of two processes racing, one key wins."""
    for folder in reversed(path.parents):  # each folder made is the user's alone
        if not folder.exists():
            folder.mkdir(mode=0o700, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(handle, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another process made it first: theirs is the key
    finally:
        tmp.unlink(missing_ok=True)


def signing_key() -> bytes:
    """This user's secret key (made on first use), checked each time it is used."""
    path = key_file()
    check_key_place(path)
    check_folders(path)  # a key refused for its folder is not made there first
    try:
        if not os.path.lexists(path):
            create_key(path)
    except OSError as e:
        fix = f"Point {KEY_FILE} at a writable place."
        raise refused(path, f"it cannot be made ({e})", fix) from None
    check_key(path)
    try:
        key = bytes.fromhex((reader.read_bytes(path, limit=1024) or b"").decode().strip())
        reason = "it is shorter than 32 bytes"
    except ValueError as e:
        key, reason = b"", str(e)
    if len(key) < 32:
        raise refused(
            path,
            f"it cannot be used ({reason})",
            "Delete the damaged key: a new one is made on first use (runs signed with the old "
            "one then count as foreign: continue them with ckpt_path=<run dir>).",
        )
    return key


def signature(payload: dict) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hmac.new(signing_key(), text.encode(), hashlib.sha256).hexdigest()
