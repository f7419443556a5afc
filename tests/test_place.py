"""The place (gptlab.run.place): every tool writes through one run-directory object, which
resolves a place where it lies whatever key names it, admits only a new or empty one or an own
run continued, never one inside anyone else's run, and on a failed start removes exactly what it
made. Each class of the issue's examples, in several forms, through the tools that hit it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import BIN, check, own_copy, run_main

from gptlab import reader
from gptlab.errors import ConfigError
from gptlab.run import ownership
from gptlab.run.place import SHARED, STORE, Place, Want

FAST = ["debug=fast", "trainer.max_steps=20"]
TOOLS = {  # a tool and an argument that fails after Hydra has started writing
    "gptlab-train": ["debug=fast", "ckpt_path=/typo"],
    "gptlab-eval": ["ckpt_path=/typo"],
    "gptlab-generate": ["ckpt_path=/typo"],
    "gptlab-inspect": ["ckpt_path=/typo"],
    "gptlab-export": ["ckpt_path=/typo", "out=exported"],
}


def tree(root: Path) -> dict[str, object]:
    """Every entry under `root`: a file's bytes, a link's target, a folder; what must not change."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = f"-> {os.readlink(path)}"
        else:
            found[rel] = path.read_bytes() if path.is_file() else "folder"
    return found


def notes(place: Path) -> Path:
    place.mkdir(parents=True)
    (place / "today.log").write_text("my notes\n")
    return place


@pytest.fixture
def foreign(finished, tmp_path) -> Path:
    """A copy of a finished run: someone else's (a copy is never own)."""
    copy = tmp_path / "foreign"
    shutil.copytree(finished, copy)
    return copy


def started(tool: str, *args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [str(BIN / tool), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)


# ------------------------------------------------------------ the object, on its own


def test_the_place_admits_new_or_empty_folders_and_undoes_only_what_it_made(tmp_path):
    place = Place()
    given = tmp_path / "given"
    given.mkdir()
    new = place.admit(tmp_path / "a" / "b" / "run", "hydra.run.dir")
    assert place.admit(given, "out") == given
    place.write_text(new / "x.log", "x")
    place.write_json(given / "sub" / "y.json", {"y": 1})
    (given / "theirs.log").write_text("another process's\n")  # meanwhile
    place.expect(new / "hydra.log")  # a library's, about to be made
    (new / "hydra.log").write_text("")
    with pytest.raises(RuntimeError, match="outside its places"):
        place.write_text(tmp_path / "elsewhere.txt", "no")
    (tmp_path / "file.txt").touch()
    for bad in (notes(tmp_path / "used"), tmp_path / "file.txt"):
        with pytest.raises(ConfigError, match="already holds files|not a folder"):
            place.admit(bad, "out")
    place.undo()
    assert not (tmp_path / "a").exists()  # the run and the parents it made
    assert sorted(p.name for p in given.iterdir()) == ["theirs.log"]  # given: kept, its own gone
    assert (tmp_path / "used" / "today.log").read_text() == "my notes\n"


def test_a_writers_store_is_decided_from_one_read_of_the_manifest_above_it(tmp_path, monkeypatch):
    """A log folder inside another run of the user's: admitted as this run's store (signed), its
    owner looked up once (the manifest above read once, not per check); continued as it is at
    the run's next start; refused where the run above is not the user's."""
    other = Place().admit(tmp_path / "other", "hydra.run.dir", ownership.RUN)
    place = Place()
    place.run_dir = place.admit(tmp_path / "run", "hydra.run.dir", ownership.RUN)
    real, reads = reader.read_json, []

    def read_json(path, *args, **kwargs):
        reads.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(reader, "read_json", read_json)
    logs = other / "logs" / "version_0"
    place.admit_writers([Want(logs, "logger.tensorboard's log folder", STORE)])
    assert reads == [other / "manifest.json"]
    assert ownership.owner(logs) == ownership.Own(logs, ownership.STORE, place.run_dir)
    again = Place()  # the run's next start
    again.run_dir = place.run_dir
    again.admit_writers([Want(logs, "logger.tensorboard's log folder", STORE)])
    assert again.roots == [logs] and sorted(p.name for p in logs.iterdir()) == ["manifest.json"]
    (other / "manifest.json").write_text("{}")  # no longer the user's
    with pytest.raises(ConfigError, match="lies inside the run or sweep directory"):
        Place().admit_writers([Want(other / "csv", "logger.csv.save_dir", SHARED)])


def test_once_training_began_nothing_is_undone(tmp_path):
    place = Place()
    run = place.admit(tmp_path / "run", "hydra.run.dir")
    place.write_text(run / "checkpoint", "x")
    place.commit()
    place.undo()
    assert (run / "checkpoint").read_text() == "x"


# ------------------------------------------- a failed start removes exactly what it made


@pytest.mark.parametrize("tool", list(TOOLS))
def test_a_failed_start_removes_only_what_it_made(tool, tmp_path):
    """Its own new directory goes; a directory it was given stays, and so does every folder
    above; a folder that holds files is refused before anything is written."""
    (tmp_path / "outputs").mkdir()
    result = run_main(*TOOLS[tool], cwd=tmp_path, tool=tool)
    assert result.returncode == 2 and "'/typo' does not exist" in result.stderr, result.stderr
    assert os.listdir(tmp_path / "outputs") == [] and "Traceback" not in result.stderr
    given = tmp_path / "given"
    given.mkdir()
    result = run_main(*TOOLS[tool], f"hydra.run.dir={given}", cwd=tmp_path, tool=tool)
    assert result.returncode == 2 and given.is_dir() and os.listdir(given) == []
    folder = notes(tmp_path / "notes")
    result = run_main(*TOOLS[tool], f"hydra.run.dir={folder}", cwd=tmp_path, tool=tool)
    assert result.returncode == 2 and "already holds files" in result.stderr
    assert tree(folder) == {"today.log": b"my notes\n"}


def test_a_file_written_meanwhile_by_another_process_survives_a_failed_start(tmp_path):
    """The issue's example: ckpt_path=/typo into a given empty directory, and another process's
    notes.log written there while the start runs (after Hydra's first files)."""
    given = tmp_path / "given"
    given.mkdir()
    process = started(
        "gptlab-train", *FAST, "ckpt_path=/typo", f"hydra.run.dir={given}", cwd=tmp_path
    )
    wait_for(given / ".hydra" / "config.yaml", process)
    (given / "notes.log").write_text("another process's\n")
    _, err = process.communicate(timeout=300)
    assert process.returncode == 2 and "'/typo' does not exist" in err
    assert tree(given) == {"notes.log": b"another process's\n"}


@pytest.mark.parametrize(
    ("sent", "code", "said"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_ctrl_c_or_sigterm_during_the_start_is_one_line_and_leaves_nothing(
    tmp_path, sent, code, said
):
    process = started("gptlab-train", *FAST, cwd=tmp_path)
    wait_for(tmp_path / "outputs", process)
    time.sleep(0.5)  # Hydra's files written; torch still loading
    process.send_signal(sent)
    _, err = process.communicate(timeout=300)
    assert process.returncode == code, err
    assert "Traceback" not in err and f"stopped by {said}" in err
    assert not list((tmp_path / "outputs").rglob("*.*"))  # no config, log or manifest left
    assert not list((tmp_path / "outputs").rglob("*/*"))  # nor the run directory it made


# ------------------------------------------- one place, whatever key names it


@pytest.mark.parametrize(
    ("spelling", "env"),
    [
        ("hydra.run.dir={dir}", {}),
        ("++hydra.run.dir={dir}", {}),
        ("hydra.run.dir=${{oc.env:GPTLAB_TEST_PLACE}}", {"GPTLAB_TEST_PLACE": "{dir}"}),
        ("hydra.run.dir= {dir}", {}),
        ("hydra.run.dir={dir}/checkpoints/..", {}),
        ("hydra.run.dir={dir}", {"SLURM_RESTART_COUNT": "1"}),  # a requeue into it
        ("hydra.run.dir={dir}/inside", {}),
        ("paths.output_dir={dir}", {}),
        ("paths.cache_dir={dir}/cache", {}),
        ("hydra.job.chdir=true paths.cache_dir=../foreign/cache hydra.run.dir={dir}/../mine", {}),
    ],
)
def test_each_key_naming_a_foreign_run_is_refused(foreign, tmp_path, spelling, env):
    before = tree(foreign)
    filled = {key: value.format(dir=foreign) for key, value in env.items()}
    args = spelling.format(dir=foreign).split(" ")
    own_dir = [] if spelling.startswith(("hydra", "++hydra")) else ["hydra.run.dir=mine"]
    result = run_main(*FAST, *args, *own_dir, cwd=tmp_path, env=filled)
    assert result.returncode == 2, result.stderr[-2000:]
    assert str(foreign) in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2
    assert tree(foreign) == before
    assert not (tmp_path / "mine").exists()


def test_paths_output_dir_is_the_run_directory_not_a_second_one(tmp_path):
    """The issue's example: a new hydra.run.dir and paths.output_dir at a folder of notes."""
    folder = notes(tmp_path / "notes")
    result = run_main(*FAST, "hydra.run.dir=new", f"paths.output_dir={folder}", cwd=tmp_path)
    assert result.returncode == 2 and "Drop paths.output_dir" in result.stderr
    assert f"hydra.run.dir={folder}" not in result.stderr  # it holds notes: refused too
    assert tree(folder) == {"today.log": b"my notes\n"} and not (tmp_path / "new").exists()
    empty = tmp_path / "empty"  # a folder that can be the run's: the fix offered is it
    result = run_main(*FAST, "hydra.run.dir=new", f"paths.output_dir={empty}", cwd=tmp_path)
    assert result.returncode == 2 and f"Give hydra.run.dir={empty} instead" in result.stderr
    assert not empty.exists() and not (tmp_path / "new").exists()


def test_a_store_of_the_runs_beside_it_is_new_or_its_own(tmp_path):
    """The Trainer's default_root_dir outside the run: a folder of notes refused; a new one made,
    signed as this run's store, refused to another run, and continued by its resume alone
    (a logger's folder: tests/test_writers.py)."""
    folder = notes(tmp_path / "notes")
    key = "trainer.default_root_dir"
    result = run_main(*FAST, f"{key}={folder}", "hydra.run.dir=new", cwd=tmp_path)
    assert result.returncode == 2 and f"{key}: '{folder}' already holds files" in result.stderr
    assert not (tmp_path / "new").exists()
    assert tree(folder) == {"today.log": b"my notes\n"}

    store, run = tmp_path / "store", tmp_path / "run"
    check(run_main(*FAST, f"{key}={store}", f"hydra.run.dir={run}", cwd=tmp_path))
    signed = (store / "manifest.json").read_bytes()
    other = run_main(*FAST, f"{key}={store}", "hydra.run.dir=other", cwd=tmp_path)
    assert other.returncode == 2 and "already holds a run, sweep or store" in other.stderr
    assert not (tmp_path / "other").exists()
    check(run_main(f"resume={run}", "trainer.max_steps=30", cwd=tmp_path))
    assert (store / "manifest.json").read_bytes() == signed


def test_eval_inspect_and_export_write_nowhere_in_someone_elses_run(finished, foreign, tmp_path):
    before = tree(foreign)
    link = tmp_path / "link"
    link.symlink_to(foreign)
    cases = [
        ("gptlab-eval", f"ckpt_path={finished}", f"output_dir={foreign}"),
        ("gptlab-inspect", f"ckpt_path={finished}", f"output_dir={foreign}"),
        ("gptlab-export", f"ckpt_path={finished}", f"out={link}/exported"),
        ("gptlab-export", f"ckpt_path={finished}", f"out={foreign}"),
    ]
    for tool, *args in cases:
        result = run_main(*args, cwd=tmp_path, tool=tool)
        assert result.returncode == 2 and str(foreign) in result.stderr, (tool, result.stderr)
        assert "Traceback" not in result.stderr
        assert f"hydra.run.dir={foreign}" not in result.stderr  # no fix that is refused too
    assert tree(foreign) == before


def test_a_tool_run_from_inside_someone_elses_run_writes_nothing_there(foreign, tmp_path):
    """The working directory is someone's run: its outputs/, data/, MLflow store, a report and
    the lm-eval task script all refused, or written elsewhere."""
    before = tree(foreign)
    for tool, args in (
        ("gptlab-train", FAST),
        ("gptlab-train", [*FAST, f"hydra.run.dir={tmp_path / 'a'}"]),  # its data/ still there
        ("gptlab-train", [*FAST, f"hydra.run.dir={tmp_path / 'b'}", f"paths.data_dir={tmp_path}",
                          f"paths.cache_dir={tmp_path}/c", "logger=mlflow"]),
        ("gptlab-eval", ["ckpt_path=."]),
    ):  # fmt: skip
        result = run_main(*args, cwd=foreign, tool=tool)
        assert result.returncode == 2, result.stderr[-2000:]
        assert "inside the run or sweep directory" in result.stderr
    report = run_main(str(tmp_path), cwd=foreign, tool="gptlab-report")
    assert report.returncode == 2 and "inside the run or sweep directory" in report.stderr
    task = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "scripts" / "next_sentence_task.py"),
         "--out", str(foreign)], capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert task.returncode == 2 and "already holds" in task.stderr
    assert tree(foreign) == before
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_planted_outputs_link_into_a_run_is_not_followed(foreign, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "outputs").symlink_to(foreign)
    before = tree(foreign)
    result = run_main(*FAST, cwd=project)
    assert result.returncode == 2 and "inside the run or sweep directory" in result.stderr
    assert tree(foreign) == before


def test_a_sweep_into_a_copy_or_through_a_linked_job_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    grid = ["-m", *FAST, "trainer.max_steps=2", "model.num_heads=1,2"]
    check(run_main(*grid, f"hydra.sweep.dir={sweep}", cwd=tmp_path))
    copy = tmp_path / "copy"
    shutil.copytree(sweep, copy)
    before = tree(copy)
    for args in ([*grid, f"++hydra.sweep.dir={copy}"], [f"resume={copy}"]):
        result = run_main(*args, cwd=tmp_path)
        assert result.returncode == 2 and str(copy) in result.stderr, result.stderr
    assert tree(copy) == before
    elsewhere = notes(tmp_path / "elsewhere")
    shutil.rmtree(sweep / "0")
    (sweep / "0").symlink_to(elsewhere)  # a job's folder became a link
    result = run_main(f"resume={sweep}", cwd=tmp_path)
    assert result.returncode == 2 and "links where its jobs' folders were" in result.stderr
    assert "Traceback" not in result.stderr and tree(elsewhere) == {"today.log": b"my notes\n"}


@pytest.mark.parametrize("override", ["hydra.sweep.subdir=../../elsewhere"])
def test_a_sweeps_job_folders_are_named_inside_it(tmp_path, override):
    result = run_main("-m", *FAST, override, cwd=tmp_path)
    assert result.returncode == 2 and "hydra.sweep.subdir" in result.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path.parent / "elsewhere").exists()


def test_an_own_run_continues_in_place_and_only_an_own_one(finished, tmp_path):
    """resume= and a requeue go on in an own directory; an own run's file a crafted link leads
    out of is the user's own doing (out of scope), so that is not tried here."""
    run = own_copy(finished, tmp_path / "run")
    check(run_main(*FAST, "trainer.max_steps=25", f"hydra.run.dir={run}", cwd=tmp_path,
                   env={"SLURM_RESTART_COUNT": "1"}))  # fmt: skip
    assert sorted(p.name for p in (run / ".hydra").iterdir() if p.is_dir())[0].startswith("resume-")


@pytest.mark.parametrize("flag", ["--help", "-h", "--cfg=job", "-c=job", "--info"])
def test_a_command_line_that_only_prints_makes_nothing(tmp_path, flag):
    result = run_main(flag, cwd=tmp_path)
    assert result.returncode == 0 and os.listdir(tmp_path) == []
