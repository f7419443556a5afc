"""Own or foreign (docs/security.md): a run or sweep directory is the user's own when it holds the
manifest.json gptlab signed at its start, for that path, with the user's key. It is signed once,
when gptlab makes the directory, and checked where the directory is read."""

import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gptlab.errors import ConfigError
from gptlab.run import directory
from gptlab.run.signing import signature

FORMAT = 2
RUN = "run"
SWEEP = "sweep"
STORE = "store"  # a folder of a run's own outside it (a logger's save_dir)


def manifest(root: Path, kind: str, of: Path | None = None) -> dict:
    """What a fresh directory's manifest.json says: its kind and its place (a store: the run or
    sweep it is of), signed."""
    data = {"format": FORMAT, "kind": kind, "dir": str(root)}
    if of:
        data["of"] = str(of)
    return {**data, "signature": signature(data)}


@dataclass(frozen=True)
class Own:
    """The own directory a place lies in: its root, its kind (RUN, SWEEP, STORE) and, for a
    store, the run or sweep it is of."""

    root: Path
    kind: str
    of: Path | None = None
    own: ClassVar[bool] = True


@dataclass(frozen=True)
class Foreign:
    """A place in no own directory, and why (said in the error that refuses it)."""

    why: str
    own: ClassVar[bool] = False


def owner(place: Path) -> Own | Foreign:
    """The own directory `place` lies in, or why there is none: the nearest manifest.json above
    it decides (a sweep's covers its jobs)."""
    return owners(place, directory.manifests(place, parent=False))[0]


def owners(place: Path, found: list[tuple[Path, Any]]) -> tuple[Own | Foreign, Own | Foreign]:
    """The own directory `place` lies in and the one its parent lies in, or why none, from the
    manifest.json files that decide them (`found`: directory.manifests): the same unless `place`
    holds one itself."""
    none = Foreign("it holds no manifest.json of gptlab's")
    judged = [*(verified(folder, data) for folder, data in found), none, none]
    if found and found[0][0] == place:
        return judged[0], judged[1]
    return judged[0], judged[0]


def verified(folder: Path, data: Any) -> Own | Foreign:
    """What the manifest.json in `folder` (`data`, as read) says, when it is signed with the
    user's key for that folder."""
    claimed = data.pop("signature", None) if isinstance(data, dict) else None
    if not isinstance(claimed, str) or not hmac.compare_digest(claimed, signature(data)):
        return Foreign("its manifest.json is not signed with your key")
    if data.get("dir") != str(folder):
        return Foreign(f"its manifest.json was signed for '{data.get('dir')}' (a copy or a move)")
    of = data.get("of")
    return Own(folder, str(data.get("kind")), Path(str(of)) if of else None)


def store_of(found: Own | Foreign, run: Path | None) -> bool:
    """`found` is signed as a store of the run or sweep `run` lies in (a logger's log folder)."""
    if not found.own or found.kind != STORE or run is None or found.of is None:
        return False
    return run.is_relative_to(found.of)


def own(place: str | Path, key: str, way: str = "") -> Own:
    """The own run or sweep directory `place` lies in; else one paragraph."""
    place = directory.where(place)
    found = owner(place)
    if not found.own:
        way = way or (
            "`gptlab-train ckpt_path=<it>` trains on from its weights in a new run directory of "
            "yours."
        )
        raise ConfigError(
            f"{key}: '{place}' is not a run or sweep directory gptlab made here for you "
            f"({found.why}), so gptlab reads it as anyone's and never continues or writes it. {way}"
        )
    return found


def check_jobs(sweep: Path) -> None:
    """A sweep continued: each job folder a folder of its own, not a link to elsewhere."""
    links = [p.name for p in sweep.iterdir() if p.is_symlink()]
    if links:
        raise ConfigError(
            f"resume: the sweep '{sweep}' holds links where its jobs' folders were "
            f"({', '.join(links[:3])}); its jobs would write wherever they lead. Remove them (or "
            "run the sweep afresh)."
        )


def job_dirs(root: str | Path) -> list[Path]:
    """The folders of a sweep's jobs: where a run has started (not the folders inside one); a
    sweep inside `root` is a folder of jobs (a wsd trunks' sweep beside their branches)."""
    marks = (directory.HYDRA, directory.CHECKPOINTS, directory.METRICS)
    found = []
    for folder, dirnames, _ in os.walk(root):
        here = Path(folder)
        inner_sweep = (here / directory.MULTIRUN).is_file()
        if here != Path(root) and not inner_sweep and any((here / m).exists() for m in marks):
            found.append(here)
            dirnames.clear()  # jobs do not nest
        dirnames[:] = [d for d in dirnames if d != ".submitit"]
    return sorted(found)
