"""Where gptlab writes, for every tool, decided by one object (docs/security.md): each place is
resolved once where it lies (realpath), whatever key names it; admitted only new or empty, or an
own run or sweep continued, never inside anyone else's; what is made there is recorded, and a
failed start removes exactly that."""

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from gptlab import files
from gptlab.errors import ConfigError
from gptlab.process import rank
from gptlab.run import directory, ownership
from gptlab.run.directory import where

# keys that name where something is written, checked here by what they name: the run directory
# itself, the shared stores the data layer writes. Where the Trainer, its loggers and callbacks
# write is asked of each once built (gptlab.training.writers): a key's leaf name does not say it.
RUN_DIR_KEYS = ("output_dir",)
STORE_KEYS = ("data_dir", "cache_dir")
WRITER_KEYS = ("dirpath", "save_dir", "default_root_dir", "log_dir", "tracking_uri")
WHERE_KEYS = (*RUN_DIR_KEYS, *STORE_KEYS, *WRITER_KEYS, "artifact_location", "root_dir")


FRESH = "fresh"  # a new or empty folder in no one else's run, checked (nothing made)
NEW = "new"  # such a folder admitted: made, with a signed manifest of its kind
STORE = "store"  # a store of this run's alone: in its places, its own continued, or NEW
SHARED = "shared"  # a store shared by runs: outside every run or sweep but the user's own


class Want(NamedTuple):
    """A place asked for: `what` it is to be (FRESH, NEW, STORE, SHARED) for `key`, `way` the
    way on its refusal names; a NEW one's manifest `kind`, and the run or sweep it is `of`."""

    path: str | Path
    key: str
    what: str
    way: str = ""
    kind: str | None = None
    of: Path | None = None


class Place:
    """This process's places (where it may write) and what it made in them, oldest first. Hydra's
    callback gptlab.run.admission admits a start's directory before Hydra writes there."""

    def __init__(self) -> None:
        self.roots: list[Path] = []
        self.made: list[Path] = []  # files and folders, recorded as they are made
        self.run_dir: Path | None = None  # the run (or tool) directory Hydra writes into
        self.committed = False  # training began: nothing is undone any more

    # --- admission ---------------------------------------------------------------------------

    def admit(
        self,
        path: str | Path,
        key: str,
        kind: str | None = None,
        own: bool = False,
        of: Path | None = None,
    ) -> Path:
        """`path` as a place of this process: an own run or sweep continued (`own`), else a new
        or empty folder outside every run (made, signed as a `kind` of the run it is `of`)."""
        if own:
            place = where(path)
            ownership.own(place, key)
            if place not in self.roots:
                self.roots.append(place)
            return place
        return self.settle(Want(path, key, NEW, kind=kind, of=of))

    def check_store(self, path: str | Path, key: str) -> None:
        """A folder a tool writes beside its run (data, caches, a tracker's store): inside this
        run, or outside every run or sweep directory but one of the user's own."""
        self.settle(Want(path, key, SHARED))

    def admit_writers(self, wants: list[Want]) -> None:
        """Where the run's writers write (gptlab.training.writers), each settled: a store of the
        run's alone (STORE: a log folder) in its places, or its own (new or empty, signed as the
        run's; or so signed, continued), a store shared by runs (SHARED) in no one else's run."""
        for want in wants:
            self.settle(want)

    def settle(self, want: Want) -> Path:
        """One place decided, then acted on: its lookups first, each once (the run or sweep
        directory it lies in, the own directories above it), then its refusal, or the folder
        made (with its signed manifest) and kept as a place of this process's."""
        place, key, what = where(want.path), want.key, want.what
        if self.has(place, what):
            return place
        way, kind, of = self.terms(want)
        inside = directory.enclosing_run(place)
        holds = "a run, sweep or store" if inside == place else "files"
        if inside == place and what != SHARED:  # a fresh folder: the run its parent lies in
            inside = directory.enclosing_run(place.parent)
        foreign = inside is not None and not any(inside.is_relative_to(r) for r in self.roots)
        signed = what == STORE and os.path.lexists(place)  # perhaps the run's store, continued
        found = directory.manifests(place) if foreign or signed else []  # read once
        here, above = ownership.owners(place, found)
        if signed and ownership.store_of(here, self.run_dir):  # the run's own, continued
            self.roots.append(place)
            return place
        if foreign and not (here if what == SHARED else above).own:  # `inside`'s owner
            raise ConfigError(
                f"{key}: '{place}' lies inside the run or sweep directory '{inside}', which "
                "gptlab does not write into (it may be anyone's). Run gptlab from another "
                f"directory (cd out of '{inside}'), or give {key} a place outside it."
            )
        if what == SHARED:
            return place
        if os.path.islink(place) or (place.exists() and not place.is_dir()):
            raise ConfigError(f"{key}: '{place}' is not a folder; give a new or empty one.")
        if place.is_dir() and any(place.iterdir()):
            raise ConfigError(
                f"{key}: '{place}' already holds {holds}; a fresh start goes into a new or "
                f"empty folder only, and writes nothing into one that holds anything. Give a new "
                f"folder, {way}"
            )
        if what == FRESH:
            return place
        # the key is checked (by signing) before anything is made
        manifest = ownership.manifest(place, kind, of) if kind else None
        self.made += files.make_dirs(place)  # a folder given empty is not made: only what goes in
        self.roots.append(place)
        if manifest is not None:
            with files.atomic(place / directory.MANIFEST) as f:
                f.write(files.as_json(manifest))
            self.made.append(place / directory.MANIFEST)
        return place

    def has(self, place: Path, what: str) -> bool:
        """`place` needs no look: a shared store inside this run, or a store of the run's in a
        place of this process's, or asked by another rank (rank 0 makes the run's stores)."""
        if what == SHARED:
            return self.run_dir is not None and place.is_relative_to(self.run_dir)
        return what == STORE and (rank() > 0 or self.covers(place))

    def terms(self, want: Want) -> tuple[str, str | None, Path | None]:
        """What `want` asks beside its place: the way on its refusal names, the kind of the
        manifest it is signed with and the run or sweep it is of (a store: of this one)."""
        if want.what == STORE:
            way = f"or leave {want.key} to follow the run directory (it writes inside it)."
            return want.way or way, ownership.STORE, self.run_dir or self.roots[-1]
        way = (
            f"drop {want.key} for a fresh one of gptlab's, or continue a run of yours with "
            "`gptlab-train resume=<its directory>`."
        )
        return want.way or way, want.kind, want.of

    def covers(self, place: Path) -> bool:
        """`place` lies in a place of this process's."""
        return any(place.is_relative_to(root) for root in self.roots)

    def admit_job(self, path: str | Path) -> Path:
        """A sweep's job directory (Hydra made it): inside its sweep, where it resolves."""
        place = where(path)
        if not self.covers(place):
            ownership.own(place, "hydra.sweep.dir")  # a launcher's process: its sweep's manifest
            self.roots.append(place)
        self.run_dir = place
        return place

    def enter(self, run_dir: Path) -> None:
        """A process Lightning spawned (a DDP rank): the run directory its parent admitted."""
        if run_dir not in self.roots:
            self.roots.append(run_dir)
        self.run_dir = run_dir
        self.committed = True

    def check_places(self, places: dict[str, Any], base: Path | None = None) -> None:
        """The keys named_places finds, each resolved in the job's directory `base` (the working
        directory unless Hydra changes into the run's): the run directory is the one Hydra
        makes; a shared store (the corpus, caches) passes check_store."""
        for key, value in places.items():
            place = where((base or Path.cwd()) / Path(value).expanduser())
            if key.rsplit(".", 1)[-1] in RUN_DIR_KEYS:
                if self.run_dir and place != self.run_dir:
                    fix = f"Give hydra.run.dir={value} instead ({key} follows it)."
                    try:  # the fix offered is one that is admitted
                        self.settle(Want(place, "hydra.run.dir", FRESH))
                    except ConfigError:
                        fix = (
                            f"Drop {key}: '{value}' cannot be a run's directory either (it holds "
                            "files or lies inside a run or sweep). To choose where, give "
                            "hydra.run.dir a new or empty folder outside every run."
                        )
                    raise ConfigError(
                        f"{key}={value}: this run's directory is '{self.run_dir}', and a run "
                        f"writes into one directory. {fix}"
                    )
            else:
                self.check_store(place, key)

    # --- what is made ----------------------------------------------------------------------

    def inside(self, path: Path) -> Path:
        """`path` when it lies in an admitted place (else a bug: every write comes through)."""
        place = where(path)
        if not any(place.is_relative_to(root) for root in self.roots):
            raise RuntimeError(f"gptlab was about to write '{place}', outside its places")
        return Path(path)

    def make_dir(self, path: str | Path) -> Path:
        """`path` and its missing parents made, each recorded; an existing folder kept."""
        path = Path(os.path.abspath(path))
        self.made += files.make_dirs(path)
        return path

    def expect(self, *paths: Path) -> None:
        """Files and folders another library is about to make here (Hydra's configs and log)."""
        self.made += [p for p in paths if not os.path.lexists(p)]

    @contextlib.contextmanager
    def atomic(self, path: str | Path, mode: str = "w") -> Iterator[IO]:
        path = self.inside(Path(path))
        self.make_dir(path.parent)
        new = not os.path.lexists(path)
        with files.atomic(path, mode) as f:
            yield f
        if new:
            self.made.append(path)

    def write_text(self, path: str | Path, text: str) -> None:
        with self.atomic(path) as f:
            f.write(text)

    def write_json(self, path: str | Path, data: Any) -> None:
        self.write_text(path, files.as_json(data))

    def save_figure(self, fig, path: str | Path, **kwargs) -> None:
        with self.atomic(path, "wb") as f:
            fig.savefig(f, format="png", **kwargs)

    def move_in(self, folder: Path, into: Path) -> None:
        """Each file of `folder` (a library's output) renamed into `into`, recorded."""
        for item in sorted(folder.iterdir()):
            new = not os.path.lexists(into / item.name)
            os.replace(item, self.inside(into / item.name))
            if new:
                self.made.append(into / item.name)

    def commit(self) -> None:
        """Training began: from now on what the run made is its result, never undone."""
        self.committed = True

    def undo(self) -> None:
        """After a failed start: what it made, newest first; folders only once empty."""
        if self.committed:
            return
        for path in reversed(self.made):
            if os.path.isdir(path) and not os.path.islink(path):
                with contextlib.suppress(OSError):  # not empty: someone else's files stay
                    os.rmdir(path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        self.made.clear()


PLACE = Place()  # this process's


def named_places(cfg: DictConfig, stores_only: bool = False) -> dict[str, str]:
    """The task's values at keys that name the run directory or a shared store (not Hydra's
    own), each resolved alone."""
    names = STORE_KEYS if stores_only else (*STORE_KEYS, *RUN_DIR_KEYS)
    found = {}
    for key in dotted_keys(OmegaConf.to_container(cfg, resolve=False)):
        leaf = key.rsplit(".", 1)[-1]
        if key.startswith("hydra.") or leaf not in names:
            continue
        value = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)  # else: the task's
        if isinstance(value, str):
            found[key] = value
    return found


def dotted_keys(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return [prefix.rstrip(".")]
    return [key for k, value in node.items() for key in dotted_keys(value, f"{prefix}{k}.")]


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_dir() -> Path | None:
    """The sweep directory of this job (what resume= continues), None outside a sweep."""
    return where(HydraConfig.get().sweep.dir) if in_multirun() else None
