"""Own or foreign: whether gptlab may continue a run or sweep directory in place. Own: its
`manifest.json`, signed with the user's key, records it and its files (docs/security.md)."""

import hmac
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from gptlab import files
from gptlab.errors import ConfigError
from gptlab.run import directory
from gptlab.run.directory import HYDRA_FILES, MANIFEST
from gptlab.run.signing import signature

FORMAT = 1
RUN = "run"
SWEEP = "sweep"
STUDY = "optuna.db"
TRACKER_FOLDER = "wandb"  # W&B keeps links of its own there (latest-run, debug logs)
TEMPORARY = "temporary"  # the manifest's list of temporary files being written


class ForeignDirectory(Exception):
    """The directory is not an own one; the message says why, in a few words."""


def canonical(root: str | Path) -> Path:
    return Path(os.path.realpath(root))


class Manifest:
    """The signed record of an own directory."""

    def __init__(self, root: Path, data: dict):
        self.root = root
        self.data = data

    @classmethod
    def new(cls, root: str | Path, kind: str) -> "Manifest":
        root = canonical(root)
        data = {"format": FORMAT, "kind": kind, "dir": str(root), "files": {}, "starts": []}
        return cls(root, {**data, "open": [], "settings": {}})

    @classmethod
    def load(cls, root: str | Path, kind: str | None = None) -> "Manifest":
        """The directory's manifest, its signature, place and kind checked, or ForeignDirectory."""
        root = canonical(root)
        data = files.read_json(root / MANIFEST)
        if not isinstance(data, dict) or "signature" not in data:
            raise ForeignDirectory("it holds no manifest.json of gptlab's: gptlab did not make it")
        claimed = data.pop("signature")
        if not isinstance(claimed, str) or not hmac.compare_digest(claimed, signature(data)):
            raise ForeignDirectory("its manifest.json is not signed with your key")
        if data.get("dir") != str(root):
            raise ForeignDirectory(
                f"its manifest.json was signed for '{data.get('dir')}' (a copy or a move)"
            )
        if kind is not None and data.get("kind") != kind:
            raise ForeignDirectory(f"it is a {data.get('kind')} directory, not a {kind} directory")
        return cls(root, data)

    def save(self) -> None:
        files.write_json(self.root / MANIFEST, {**self.data, "signature": signature(self.data)})

    def accepted(self, rel: str) -> list[str]:
        return self.data["files"].get(rel, [])

    def accept(self, rel: str, digest: str) -> None:
        self.data["files"][rel] = [*self.accepted(rel)[-1:], digest]

    def settle(self, rel: str, digest: str) -> None:
        self.data["files"][rel] = [digest]

    def record(self, rel: str) -> None:
        self.settle(rel, files.sha256_of(self.root / rel))

    def set_open(self, rel: str, is_open: bool) -> None:
        """A file others write while it is open (a sweep's study during a batch)."""
        rest = [name for name in self.data["open"] if name != rel]
        self.data["open"] = [*rest, rel] if is_open else rest

    @property
    def starts(self) -> list[str]:
        """The .hydra folders of the recorded starts, first to latest."""
        return list(self.data["starts"])

    def verify(self, present: list[str]) -> None:
        """Every relied-on file there must be recorded and unchanged (but an open one)."""
        for rel in sorted(set(present) | set(self.data["files"])):
            path = self.root / rel
            if rel in self.data["open"] or not path.is_file():
                continue
            if rel not in self.data["files"]:
                raise ForeignDirectory(f"'{rel}' was not written by gptlab")
            if files.sha256_of(path) not in self.accepted(rel):
                raise ForeignDirectory(f"'{rel}' has changed since gptlab wrote it")


def own_manifest(root: str | Path) -> Manifest | None:
    try:
        return Manifest.load(root)
    except ForeignDirectory:
        return None


def write_recorded(root: str | Path, rel: str, write: Callable[[IO], Any], mode: str = "w"):
    """Write root/rel whole; in an own directory its temporary file and digest are recorded, so
    that the manifest accepts it before, during and after the rename."""
    manifest = own_manifest(root)
    written = []

    def begin(tmp: Path) -> None:  # killed while it is written: the next start removes it
        if manifest is not None:
            rel_tmp = Path(os.path.realpath(tmp)).relative_to(manifest.root)
            manifest.data.setdefault(TEMPORARY, []).append(str(rel_tmp))
            manifest.save()

    def accept(tmp: Path) -> None:
        written.append(files.sha256_of(tmp))
        if manifest is not None:
            manifest.accept(rel, written[0])
            manifest.save()

    with files.atomic(Path(root) / rel, mode, accept, begin) as f:
        write(f)
    if manifest is not None:
        manifest.settle(rel, written[0])
        manifest.data[TEMPORARY] = []
        manifest.save()


def claim(root: str | Path, subdir: str | None) -> None:
    """A start (rank 0) in `root`: its manifest (new for a sweep's new job), a killed start's
    temporary files removed, Hydra's configs in `subdir` recorded; anyone else's refused."""
    root = Path(root)
    try:
        check_plain(root)
        manifest = Manifest.load(root, RUN) if os.path.lexists(root / MANIFEST) else None
    except ForeignDirectory as e:
        raise ConfigError(
            f"The run directory '{root}' is not one gptlab made here for you ({e}); gptlab "
            "writes nothing into it. Start in a new directory: drop hydra.run.dir, or "
            "continue its training in a new run directory: gptlab-train ckpt_path=<it>."
        ) from None
    manifest = manifest or Manifest.new(root, RUN)
    for rel in manifest.data.setdefault(TEMPORARY, []):
        path = manifest.root / rel
        inside = Path(os.path.realpath(path)).is_relative_to(manifest.root)
        if inside and os.path.isfile(path) and not os.path.islink(path):
            path.unlink()  # a temporary file a killed start of this run made and recorded
    manifest.data[TEMPORARY] = []
    if subdir is not None and subdir not in manifest.starts:
        for name in HYDRA_FILES:
            if (manifest.root / subdir / name).is_file():
                manifest.record(f"{subdir}/{name}")
        manifest.data["starts"].append(subdir)
    manifest.save()


def unsafe_entries(root: Path) -> list[str]:
    """Links, hard links and special files anywhere inside `root`, but W&B's own in its wandb/."""
    root = canonical(root)
    tracker = root / TRACKER_FOLDER
    found = []
    for folder, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(folder) / name
            info = path.lstat()
            inside = path.is_relative_to(tracker)
            if stat.S_ISLNK(info.st_mode):
                if not (inside and trackers_link(path, root)):
                    found.append(f"'{path.relative_to(root)}' is a symlink")
            elif stat.S_ISREG(info.st_mode) and info.st_nlink > 1 and not inside:
                found.append(f"'{path.relative_to(root)}' has {info.st_nlink} hard links")
            elif not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
                found.append(f"'{path.relative_to(root)}' is not a regular file")
    return found


def trackers_link(link: Path, root: Path) -> bool:
    """W&B's link: into the run, or its core's debug log in W&B's own cache folder."""
    target = Path(os.path.realpath(link))
    env = os.environ
    cache = env.get("WANDB_CACHE_DIR") or env.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    core_log = link.name == "debug-core.log" and target.name.startswith("core-debug-")
    in_cache = target.parent == Path(os.path.realpath(cache)) / "wandb" / "logs"
    return target.is_relative_to(root) or (core_log and in_cache)


def check_plain(root: Path) -> None:
    if root.is_symlink():
        raise ForeignDirectory("it is a symlink")
    found = unsafe_entries(root)
    if found:
        shown = ", ".join(found[:3]) + (" ..." if len(found) > 3 else "")
        raise ForeignDirectory(f"{shown}, which could lead gptlab elsewhere")


def relied_files(root: Path) -> list[str]:
    """A run's files whose content decides what a continued run does."""
    folder = directory.checkpoint_dir(root)
    found = [directory.METRICS] if directory.metrics_file(root).exists() else []
    if folder.is_dir():
        names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
        found += [f"{directory.CHECKPOINTS}/{name}" for name in names]
    return found


def check_run(root: str | Path) -> Manifest:
    """An own run directory's manifest, all it relies on checked; else ForeignDirectory."""
    root = Path(root)
    check_plain(root)
    manifest = Manifest.load(root, RUN)
    manifest.verify(relied_files(root))
    return manifest


def job_dirs(root: str | Path) -> list[Path]:
    """The folders of a sweep's jobs: where a run has started (not the folders inside one); a
    sweep inside `root` is a folder of jobs (a wsd trunks' sweep beside their branches)."""
    marks = (directory.HYDRA, directory.CHECKPOINTS, directory.METRICS, MANIFEST)
    found = []
    for folder, dirnames, _ in os.walk(root):
        here = Path(folder)
        inner_sweep = (here / directory.MULTIRUN).is_file()
        if here != Path(root) and not inner_sweep and any((here / m).exists() for m in marks):
            found.append(here)
            dirnames.clear()  # jobs do not nest
        dirnames[:] = [d for d in dirnames if d != ".submitit"]
    return sorted(found)


def check_sweep(root: str | Path) -> Manifest:
    """An own sweep directory's manifest, its study and jobs checked; else ForeignDirectory."""
    root = Path(root)
    check_plain(root)
    manifest = Manifest.load(root, SWEEP)
    manifest.verify([STUDY] if (root / STUDY).exists() else [])
    for job in job_dirs(canonical(root)):
        name = job.relative_to(canonical(root))
        if (job / MANIFEST).exists():
            try:
                check_run(job)
            except ForeignDirectory as e:
                raise ForeignDirectory(f"its job '{name}' is foreign: {e}") from None
        elif directory.holds_run(job):
            raise ForeignDirectory(f"its job '{name}' holds results gptlab did not record")
    return manifest


def record_sweep(root: str | Path, **settings: Any) -> None:
    """Record what a sweep's resume replays (its overrides, its sweeper's settings)."""
    root = Path(root)
    manifest = own_manifest(root) if (root / MANIFEST).exists() else Manifest.new(root, SWEEP)
    if manifest is None:
        raise ConfigError(
            f"The sweep directory '{root}' holds a manifest.json that is not yours; gptlab writes "
            "nothing into it. Give a new sweep directory (drop hydra.sweep.dir)."
        )
    manifest.data["settings"].update(settings)
    manifest.save()


def record_study(root: str | Path, is_open: bool) -> None:
    """The sweep's study open during a batch of trials; its digest recorded after."""
    manifest = own_manifest(root)
    if manifest is None:
        return
    if not is_open and (manifest.root / STUDY).is_file():
        manifest.record(STUDY)
    manifest.set_open(STUDY, is_open)
    manifest.save()
