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
# Values (keys and items among them) counted before a file is parsed: what parsing builds grows
# with them, not with bytes (8 MiB of `[],` is 3 million lists: gigabytes, and minutes of YAML)
MAX_NODES = 1 << 16  # a run's JSON or YAML (gptlab's own: some hundreds)
MAX_TOKENIZER_NODES = 1 << 22  # a tokenizer.json (cl100k_base's: 806,357)
MAX_MEMBERS = 1 << 16  # a checkpoint's archive entries: one per tensor, and a few more
CONTAINERS = (dict, list, tuple, set)  # what torch.load's weights_only unpickler builds
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


def json_nodes(raw: bytes) -> int:
    """At most how many values a JSON text holds, counted in its bytes before it is parsed: each
    value but the first of its container follows a comma."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1


def check_yaml(raw: bytes, nodes: int) -> None:
    """libyaml's parse events, read before anything is built: at most `nodes` values, nested at
    most MAX_DEPTH deep, no alias (what a file holds stays bounded by its size)."""
    count = level = 0
    for event in yaml.parse(raw, YAML_LOADER):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.YAMLError("aliases are not read")
        if isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent):
            count += 1
        if isinstance(event, yaml.CollectionStartEvent):
            level += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            level -= 1
        if count > nodes or level > MAX_DEPTH:
            raise yaml.YAMLError(f"more than {nodes} values or {MAX_DEPTH} levels")


def parse_yaml(raw: bytes, nodes: int = MAX_NODES) -> Any:
    """YAML's safe loader in C, once its events are bounded (check_yaml)."""
    check_yaml(raw, nodes)
    return yaml.load(raw, Loader=YAML_LOADER)  # noqa: S506 - the safe loader


def parse_json(raw: bytes, nodes: int = MAX_NODES) -> Any:
    if json_nodes(raw) > nodes:
        raise ValueError(f"more than {nodes} values")
    return json.loads(raw)


def read_data(path: str | Path, yaml_too: bool = False, limit: int = MAX_TEXT, nodes=MAX_NODES):
    """A JSON (or YAML) file as plain data; None when read_bytes gives none, it holds more than
    `nodes` values, it is too deep, or it does not parse."""
    raw = read_bytes(path, limit)
    parse = parse_yaml if yaml_too else parse_json
    try:
        data = None if raw is None else parse(raw, nodes)
    except (ValueError, yaml.YAMLError, RecursionError):
        return None
    return data if depth(data) <= MAX_DEPTH else None


def read_json(path: str | Path, limit: int = MAX_TEXT, nodes: int = MAX_NODES) -> Any:
    return read_data(path, limit=limit, nodes=nodes)


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
    pickled = max((m.file_size for m in members if m.filename.endswith("/data.pkl")), default=0)
    if pickled > MAX_TEXT:  # its objects: settings and tensor names (a gptlab run's: kilobytes)
        raise not_a_checkpoint(path, f"its settings take {pickled:,} bytes (at most {MAX_TEXT:,})")
    if sum(m.file_size for m in members) > size:
        raise not_a_checkpoint(path, "its members declare more bytes than the file holds")


def first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no details'}"


def load_checkpoint(path: str | Path) -> dict:
    """torch.load with weights_only=True, mapped from the file (nothing is copied yet), once the
    archive is bounded; its containers bounded in depth (parts), its tensors plain dense arrays
    within what the file holds (check_tensors)."""
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
    tensors = parts(checkpoint, path)
    state = checkpoint.get("state_dict")
    if isinstance(state, dict) and not all(
        isinstance(name, str) and is_tensor(t) for name, t in state.items()
    ):
        raise not_a_checkpoint(path, "its state_dict holds something other than tensors")
    check_tensors(tensors, path)
    return checkpoint


def parts(checkpoint: dict, path: str | Path) -> list[tuple[str, Any]]:
    """The checkpoint's tensors (each object once, but a state_dict's every entry) named by their
    top key and their own, once no path through its containers goes more than MAX_DEPTH deep and
    none loops: walked without recursion, each container once (one that two hold is met again
    with its depth known), so whatever recurses later is bounded here; names stay short, however
    long or many the file's keys."""
    depths: dict[int, int] = {}  # id -> how deep its deepest path goes, once walked
    found, seen, walking, todo = [], set(), set(), [(checkpoint, "", 1, False)]
    while todo:
        node, top, level, done = todo.pop()
        children = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        children += [("key", k) for k in node if isinstance(node, dict) and isinstance(k, tuple)]
        inner = [(label(k), c) for k, c in children if isinstance(c, CONTAINERS)]
        if done:
            walking.discard(id(node))
            depths[id(node)] = 1 + max((depths[id(c)] for _, c in inner), default=0)
        elif id(node) in walking:
            raise not_a_checkpoint(path, f"its {top or 'settings'} hold themselves")
        elif level + depths.get(id(node), 1) - 1 > MAX_DEPTH:
            raise not_a_checkpoint(path, f"its {top} are nested more than {MAX_DEPTH} deep")
        elif id(node) not in depths:
            walking.add(id(node))
            weights = top == "state_dict" and level == 2  # every entry a weight to build
            for key, t in children:
                if is_tensor(t) and (weights or id(t) not in seen):
                    seen.add(id(t))
                    found.append((f"{top}.{label(key)}".lstrip("."), t))
            todo.append((node, top, level, True))
            todo += [(c, top or k, level + 1, False) for k, c in inner]
    return found


def label(key: Any) -> str:
    """A key as a name shows it: short, whatever the file put there (a long string, a number of
    a million digits, a tuple nested deep)."""
    if isinstance(key, str):
        return key[:80]
    if isinstance(key, int) and abs(key) < 10**18:
        return str(key)
    return type(key).__name__


def is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def check_tensors(tensors: list[tuple[str, Any]], path: str | Path) -> None:
    """Every tensor a plain dense array (strided: no sparse, nested or quantized one), inside its
    own storage (a storage mapped from the file lies within it: a crafted stride, a 2 KB file
    posing as a 32768x32768 table, is refused first), no two overlapping, and none named more
    than twice (a tied embedding and head): what they hold is at most twice what the file holds
    (1,450 views of one storage would build a model 1,450 times the file)."""
    import torch

    views: dict[tuple, list[str]] = {}
    for name, t in tensors:
        if (
            type(t) not in (torch.Tensor, torch.nn.Parameter)
            or t.layout != torch.strided
            or t.is_nested
            or t.is_quantized
        ):
            raise not_a_checkpoint(path, f"its tensor {name} is not a plain dense array")
        start = t.storage_offset() * t.element_size()
        end = start + t.numel() * t.element_size()
        if not t.is_contiguous() or end > t.untyped_storage().nbytes():
            raise not_a_checkpoint(path, f"its tensor {name} is not a dense array of its shape")
        if end > start:  # an empty one holds nothing; a tie is the same bytes and shape
            key = (t.untyped_storage().data_ptr(), start, end, tuple(t.shape))
            views.setdefault(key, []).append(name)
    for names in views.values():
        weights = [name for name in names if name.startswith("state_dict.")]
        if len(weights) > 2:
            raise not_a_checkpoint(path, f"{len(weights)} of its weights are one ({weights[0]})")
    storage = reach = None  # the views in order: each must start where those before it end
    for key in sorted(views):
        if key[0] == storage and key[1] < reach:
            raise not_a_checkpoint(path, f"its tensor {views[key][0]} overlaps another")
        storage, reach = key[0], max(key[2], reach if key[0] == storage else 0)


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
