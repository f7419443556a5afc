"""The one reader of foreign files (docs/security.md): a run's JSON and YAML, and checkpoints,
bounded before anything is allocated for what they say (a Hugging Face folder's safetensors:
gptlab.run.hf_folder, by its header). Links are followed only where asked; FIFOs, sockets and
devices are never opened for reading."""

import hashlib
import json
import os
import stat
import zipfile
from pathlib import Path
from typing import IO, Any

import yaml

from gptlab.errors import ConfigError
from gptlab.process import available_memory

MAX_TEXT = 8 << 20  # a run's JSON or YAML: a saved config, metrics.json, a manifest
MAX_TOKENIZER = 64 << 20  # a Hugging Face tokenizer.json (o200k_base's: about 27 MB)
MAX_DEPTH = 32  # gptlab's own files nest at most 6 deep
MAX_MEMBERS = 1 << 16  # a checkpoint's archive entries: one per tensor, and a few more
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's C loader when built


def open_regular(path: str | Path, follow: bool = False) -> IO[bytes]:
    """`path` opened if a regular file, else OSError (no FIFO waited on; links only if `follow`)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    handle = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise OSError(f"'{path}' is not a regular file")
    return os.fdopen(handle, "rb")


def read_bytes(path: str | Path, limit: int = MAX_TEXT) -> bytes | None:
    """A regular file's bytes; None when it is missing, unreadable, not one, or over `limit`."""
    try:
        with open_regular(path) as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def sha256_of(path: str | Path) -> str:
    """The sha256 of a regular file's content, read in chunks (OSError for anything else)."""
    digest = hashlib.sha256()
    with open_regular(path, follow=True) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def depth(data: Any) -> int:
    """How deeply lists and dicts nest (without recursion; only containers are visited)."""
    deepest, todo = 0, [(data, 1)] if isinstance(data, dict | list) else []
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        children = node.values() if isinstance(node, dict) else node
        todo += [(child, level + 1) for child in children if isinstance(child, dict | list)]
    return deepest


def parse_yaml(raw: bytes) -> Any:
    """YAML's safe loader in C; anchors refused (what a file holds is bounded by its size)."""
    if b"&" in raw and any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(raw, YAML_LOADER)):
        raise yaml.YAMLError("aliases are not read")
    return yaml.load(raw, Loader=YAML_LOADER)  # noqa: S506 - the safe loader


def read_data(path: str | Path, yaml_too: bool = False, limit: int = MAX_TEXT) -> Any:
    """A JSON (or YAML) file as plain data; None when read_bytes gives none, it is too deep, or
    it does not parse."""
    raw = read_bytes(path, limit)
    try:
        data = None if raw is None else parse_yaml(raw) if yaml_too else json.loads(raw)
    except (ValueError, yaml.YAMLError, RecursionError):
        return None
    return data if depth(data) <= MAX_DEPTH else None


def read_json(path: str | Path, limit: int = MAX_TEXT) -> Any:
    return read_data(path, limit=limit)


def read_yaml(path: str | Path) -> Any:
    return read_data(path, yaml_too=True)


def not_a_checkpoint(path: str | Path, why: str) -> ConfigError:
    return ConfigError(
        f"ckpt_path: '{path}' is not a checkpoint gptlab can read: {why}. Give one saved by "
        "gptlab-train (a run's checkpoints/last.ckpt or best.ckpt)."
    )


def check_archive(path: str | Path) -> None:
    """Before torch reads a byte: a regular file, a zip of few stored members within its size."""
    try:
        with open_regular(path, follow=True) as f:
            size = os.fstat(f.fileno()).st_size
            with zipfile.ZipFile(f) as archive:
                members = archive.infolist()
    except FileNotFoundError:
        raise ConfigError(f"ckpt_path: '{path}' does not exist.") from None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as e:
        why = f"it is truncated or not a checkpoint at all (not a whole zip archive: {e})"
        raise not_a_checkpoint(path, why) from None
    if len(members) > MAX_MEMBERS:
        raise not_a_checkpoint(path, f"it holds {len(members):,} entries")
    if any(m.compress_type != zipfile.ZIP_STORED for m in members):
        raise not_a_checkpoint(path, "it holds compressed members, which torch.save never writes")
    if sum(m.file_size for m in members) > size:
        raise not_a_checkpoint(path, "its members declare more bytes than the file holds")


def first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no details'}"


def load_checkpoint(path: str | Path) -> dict:
    """torch.load with weights_only=True, mapped from the file (nothing is copied yet), once the
    archive is bounded; its `state_dict` tensors dense views within their storage."""
    import pickle

    import torch

    check_archive(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        raise ConfigError(
            f"ckpt_path: '{path}' holds Python objects besides tensors and plain values. gptlab "
            "never unpickles them (unpickling runs whatever code the file names), and every "
            "checkpoint gptlab-train saves holds none. Use one saved by gptlab-train."
        ) from None
    except RecursionError:
        raise not_a_checkpoint(path, "its settings are nested too deeply") from None
    except Exception as e:  # zip, EOF and storage errors all mean the same thing here
        reason = first_line(e).split(" Please ")[0].split(" (1) ")[0]  # not torch's advice
        raise not_a_checkpoint(path, f"it is truncated or not a checkpoint ({reason})") from None
    if not isinstance(checkpoint, dict):
        raise not_a_checkpoint(path, f"it holds a {type(checkpoint).__name__}")
    state = checkpoint.get("state_dict")
    if isinstance(state, dict):
        check_tensors(state, path)
    return checkpoint


def check_tensors(state: dict, path: str | Path) -> None:
    """Every tensor a dense view inside its own storage (a storage mapped from the file lies
    within it): a crafted stride (a 2 KB file posing as a 32768x32768 table) is refused first."""
    import torch

    for name, t in state.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise not_a_checkpoint(path, "its state_dict holds something other than tensors")
        need = (t.storage_offset() + t.numel()) * t.element_size()
        if not t.is_contiguous() or need > t.untyped_storage().nbytes():
            raise not_a_checkpoint(path, f"its tensor {name} is not a dense array of its shape")


def load_safetensors(path: Path, blocks: int) -> dict:
    """A safetensors file (no pickle, no code): a regular file, the blocks its header names
    (...h.<i>. or ...layers.<i>.) counted before anything is read, as many as `blocks`, and the
    file within the memory available; ValueError says what is wrong."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    with open_regular(path) as f:  # no FIFO waited on, no link followed
        size, header = os.fstat(f.fileno()).st_size, int.from_bytes(f.read(8), "little")
    if header > MAX_TEXT:  # its JSON header: one entry a tensor (a GPT's: some kilobytes)
        raise ValueError(f"its header says {header} bytes (at most {MAX_TEXT} are read)")
    try:
        with safe_open(path, "pt") as f:
            names = [name.split(".") for name in f.keys()]
    except SafetensorError as e:  # a damaged or foreign file
        raise ValueError(f"it does not read ({e})") from None
    held = {p[i + 1] for p in names for i in range(len(p) - 1) if p[i] in ("h", "layers")}
    held = {block for block in held if block.isdigit()}
    if len(held) != blocks:
        raise ValueError(f"it holds {len(held)} blocks where config.json says {blocks}")
    if size > (available_memory() or size):
        raise ValueError("it is larger than the memory available")
    return load_file(path)
