"""The user's signing key and the signature of a manifest (gptlab.run.ownership).

The key lives outside every run directory (~/.config/gptlab/key, or the file GPTLAB_KEY_FILE
names), is made on first use and is readable by the user only: whoever lacks it cannot make a
directory look like one of the user's own, the way Jupyter signs notebooks."""

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from gptlab.errors import ConfigError

KEY_FILE = "GPTLAB_KEY_FILE"


def key_file() -> Path:
    given = os.environ.get(KEY_FILE)
    if given:
        return Path(given).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "gptlab" / "key"


def create_key(path: Path) -> None:
    """A new random key, readable by this user only; of two processes racing, one key wins."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
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
    """This user's secret key (made on first use)."""
    path = key_file()
    try:
        if not path.exists():
            create_key(path)
        key = bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError) as e:
        key, reason = b"", str(e)
    else:
        reason = "it is shorter than 32 bytes"
    if len(key) < 32:
        raise ConfigError(
            f"{KEY_FILE}: gptlab cannot use its signing key '{path}' ({reason}). It is made on "
            f"first use; point {KEY_FILE} at a writable place, or delete a damaged key (runs "
            "signed with it then count as foreign: continue them with ckpt_path=<run dir>)."
        )
    return key


def signature(payload: dict) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hmac.new(signing_key(), text.encode(), hashlib.sha256).hexdigest()
