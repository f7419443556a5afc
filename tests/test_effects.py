"""Nothing lost, nothing written outside, nothing exhausted: the classes of the trust battery that
sit outside the own/foreign boundary, each tried in several forms (gptlab.files, gptlab.run.place,
gptlab.run.bounds): a directory that existed before a failed start; each spelling of the output
directory; hard links and nested `wandb` folders; a tool run from inside a foreign directory;
a misplaced key; a file that asks for more than the machine has."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import BIN, own_copy, run_main

from gptlab import files

FAST = ["debug=fast", "trainer.max_steps=20"]
TOOLS = {  # a tool and an argument that fails after Hydra would have started writing
    "gptlab-train": ["debug=fast", "model.num_heads=3"],
    "gptlab-eval": ["ckpt_path=/typo"],
    "gptlab-generate": ["ckpt_path=/typo"],
    "gptlab-inspect": ["ckpt_path=/typo"],
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


# ------------------------------------------------------- 1. deletion of what it did not create


@pytest.mark.parametrize("tool", list(TOOLS))
def test_a_directory_that_existed_survives_every_tools_failed_start(tool, tmp_path):
    """The issue's own example, for every tool: notes/ exactly as it was, and nothing new."""
    folder = notes(tmp_path / "notes")
    before = tree(folder)
    result = run_main(*TOOLS[tool], f"hydra.run.dir={folder}", cwd=tmp_path, tool=tool)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "already holds files" in result.stderr and "Traceback" not in result.stderr
    assert tree(folder) == before


@pytest.mark.parametrize("tool", list(TOOLS))
def test_a_failed_start_removes_only_what_it_created(tool, tmp_path):
    """Its own new directory goes; an empty directory it was given stays (empty), and so does
    every folder above."""
    (tmp_path / "outputs").mkdir()
    result = run_main(*TOOLS[tool], cwd=tmp_path, tool=tool)
    assert result.returncode == 2 and os.listdir(tmp_path / "outputs") == []
    given = tmp_path / "given"
    given.mkdir()
    result = run_main(*TOOLS[tool], f"hydra.run.dir={given}", cwd=tmp_path, tool=tool)
    assert result.returncode == 2 and given.is_dir() and os.listdir(given) == []


def test_remove_created_removes_nothing_it_did_not_make(tmp_path):
    existing = notes(tmp_path / "old")
    files.remove_created(existing)
    assert (existing / "today.log").read_text() == "my notes\n"
    made = files.make_dir(tmp_path / "new" / "run")
    (made / "x.log").write_text("x")
    files.remove_created(made)
    assert not (tmp_path / "new").exists()  # the run and the parent it made
    with pytest.raises(FileExistsError):
        files.make_dir(existing)


# ------------------------------------------ 2. the output directory where it resolves, any spelling


@pytest.fixture
def foreign(finished, tmp_path) -> Path:
    """A copy of a finished run (foreign: a copy), without .hydra/."""
    copy = tmp_path / "foreign"
    shutil.copytree(finished, copy)
    shutil.rmtree(copy / ".hydra")
    return copy


@pytest.mark.parametrize(
    ("spelling", "env"),
    [
        ("++hydra.run.dir={dir}", {}),
        ("hydra.run.dir=${{oc.env:GPTLAB_TEST_PLACE}}", {"GPTLAB_TEST_PLACE": "{dir}"}),
        ("hydra.run.dir= {dir}", {}),
        ("hydra.run.dir={dir}", {"SLURM_RESTART_COUNT": "1"}),  # a requeue into it
    ],
)
def test_each_spelling_of_a_foreign_run_directory_is_refused(foreign, tmp_path, spelling, env):
    before = tree(foreign)
    filled = {key: value.format(dir=foreign) for key, value in env.items()}
    result = run_main(*FAST, spelling.format(dir=foreign), cwd=tmp_path, env=filled)
    assert result.returncode == 2, result.stderr[-2000:]
    assert str(foreign) in result.stderr and "Traceback" not in result.stderr
    assert tree(foreign) == before


def test_a_sweep_into_a_copy_of_a_sweep_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    grid = ["-m", *FAST, "trainer.max_steps=2", "model.num_heads=1,2"]
    ran = subprocess.run(
        [str(BIN / "gptlab-train"), *grid, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    copy = tmp_path / "copy"
    shutil.copytree(sweep, copy)
    before = tree(copy)
    result = run_main(*grid, f"++hydra.sweep.dir={copy}", cwd=tmp_path)
    assert result.returncode == 2 and "hydra.sweep.dir" in result.stderr
    assert tree(copy) == before  # no multirun.yaml rewritten, no job started


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("hydra.output_subdir=../../elsewhere", "hydra.output_subdir"),
        ("hydra.sweep.subdir=../../elsewhere", "hydra.sweep.subdir"),
    ],
)
def test_folders_inside_the_output_directory_are_gptlabs_to_name(tmp_path, override, words):
    result = run_main("-m", *FAST, override, cwd=tmp_path)
    assert result.returncode == 2 and words in result.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path.parent / "elsewhere").exists()


# ------------------------------------------------------------ 3. hard links, nested wandb folders


@pytest.mark.parametrize("plant", ["hard-linked train.log", "tensorboard/wandb", ".hydra/wandb"])
def test_a_resume_refuses_links_hard_or_in_a_nested_wandb_folder(finished, tmp_path, plant):
    run = own_copy(finished, tmp_path / "run")
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's\n")
    if plant == "hard-linked train.log":
        (run / "train.log").unlink()
        os.link(secret, run / "train.log")
    else:
        (run / plant).mkdir(parents=True)
        (run / plant / "x").symlink_to(secret)
    result = run_main(f"resume={run}", "trainer.max_steps=30", cwd=tmp_path)
    assert result.returncode == 2 and "not a run directory gptlab made here" in result.stderr
    assert secret.read_text() == "the user's\n" and "the user's" not in result.stderr


def test_a_log_is_never_appended_through_a_link(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's\n")
    os.link(secret, tmp_path / "hard.log")
    (tmp_path / "soft.log").symlink_to(secret)
    for name in ("hard.log", "soft.log"):
        with pytest.raises(OSError, match="link|symbolic"):
            files.LogFile(tmp_path / name)
    assert secret.read_text() == "the user's\n"


# ------------------------------------------------------------------- 4. the working directory


def test_a_tool_run_from_inside_a_foreign_directory_writes_nothing_there(foreign, tmp_path):
    before = tree(foreign)
    for tool, args in (("gptlab-eval", ["ckpt_path=."]), ("gptlab-train", FAST)):
        result = run_main(*args, cwd=foreign, tool=tool)
        assert result.returncode == 2, result.stderr[-2000:]
        assert "inside the run or sweep directory" in result.stderr
    elsewhere = tmp_path / "elsewhere"  # its outputs elsewhere, its data/ still inside: refused
    result = run_main(*FAST, f"hydra.run.dir={elsewhere}", cwd=foreign)
    assert result.returncode == 2 and "data.cache_dir" in result.stderr
    assert not elsewhere.exists()  # made by this start, removed with its failure
    assert tree(foreign) == before


def test_a_planted_outputs_link_into_a_run_is_not_followed(foreign, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "outputs").symlink_to(foreign)
    before = tree(foreign)
    result = run_main(*FAST, cwd=project)
    assert result.returncode == 2 and "inside the run or sweep directory" in result.stderr
    assert tree(foreign) == before


# ---------------------------------------------------------------------------------- 5. the key


def key_result(tmp_path: Path, key: Path | str) -> subprocess.CompletedProcess:
    return run_main(*FAST, cwd=tmp_path, env={"GPTLAB_KEY_FILE": str(key)})


def test_a_relative_key_path_is_refused(tmp_path):
    result = key_result(tmp_path, "key")
    assert result.returncode == 2 and "relative path" in result.stderr
    assert not (tmp_path / "key").exists() and not (tmp_path / "outputs").exists()


def test_a_key_others_can_read_or_write_or_a_linked_key_is_refused(tmp_path):
    key = tmp_path / "keys" / "key"
    key.parent.mkdir()
    key.write_text("ab" * 32 + "\n")
    for mode in (0o640, 0o604, 0o620):
        key.chmod(mode)
        result = key_result(tmp_path, key)
        assert result.returncode == 2 and "chmod 600" in result.stderr, oct(mode)
    key.chmod(0o600)
    (tmp_path / "keys" / "link").symlink_to(key)
    result = key_result(tmp_path, tmp_path / "keys" / "link")
    assert result.returncode == 2 and "symlink" in result.stderr
    assert not (tmp_path / "outputs").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_key_of_another_user_is_refused(tmp_path):
    key = tmp_path / "key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o600)
    os.chown(key, 4242, 4242)
    result = key_result(tmp_path, key)
    assert result.returncode == 2 and "user id 4242" in result.stderr


def test_a_key_inside_a_run_directory_is_refused(finished, tmp_path):
    run = own_copy(finished, tmp_path / "run")
    result = key_result(tmp_path, run / "key")
    assert result.returncode == 2 and "inside the run or sweep directory" in result.stderr
    assert not (run / "key").exists()


# ---------------------------------------------------------------------------- 6. resources


def measured(tool: str, *args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, int]:
    """`tool args` as a process of its own, and its peak memory in bytes (the wrapper's only
    child)."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stderr.write(r.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"
        "sys.exit(r.returncode)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", wrapper, str(BIN / tool), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,  # a hang would end here
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return result, int(result.stdout.split()[-1])


def crafted(finished: Path, tmp_path: Path, name: str, change) -> Path:
    checkpoint = torch.load(finished / "checkpoints" / "best.ckpt", weights_only=True)
    change(checkpoint)
    torch.save(checkpoint, tmp_path / name)
    return tmp_path / name


def settings(**values):
    return lambda checkpoint: checkpoint["hyper_parameters"]["model"].update(values)


def zip_bomb(path: Path) -> None:
    """A zip whose one member deflates 256 KB into 256 MB: torch.save never compresses."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("archive/data.pkl", "w", force_zip64=True) as member:
            block = bytes(1 << 20)
            for _ in range(256):
                member.write(block)


@pytest.mark.parametrize(
    "bomb",
    ["num_blocks", "context_length", "d_model", "vocab_size", "zip", "step"],
)
def test_a_checkpoint_that_asks_for_too_much_is_refused_quickly_and_small(finished, tmp_path, bomb):
    """Refused with one paragraph and exit 2, before anything is allocated for it: the peak
    memory is that of a tool that loaded torch, well under 1 GB."""
    changes = {
        "num_blocks": settings(num_blocks=100_000),
        "context_length": settings(context_length=10**7),
        "d_model": settings(d_model=2**20, num_heads=1),
        "vocab_size": settings(vocab_size=10**9),
        "step": lambda checkpoint: checkpoint.update(global_step=2**80),
    }
    if bomb == "zip":
        path = tmp_path / "bomb.ckpt"
        zip_bomb(path)
    else:
        path = crafted(finished, tmp_path, f"{bomb}.ckpt", changes[bomb])
    tool = "gptlab-eval" if bomb == "step" else "gptlab-generate"
    result, peak = measured(tool, f"ckpt_path={path}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "weights_only=False" not in result.stderr
    assert peak < 1 << 30, peak


def test_run_files_that_hang_or_nest_are_read_as_nothing(finished, tmp_path):
    """A FIFO as manifest.json (reading it would wait forever), metrics.json nested 100,000 deep
    and a YAML alias bomb as the saved config: eval still reads the checkpoint's tensors."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "manifest.json").unlink()
    os.mkfifo(run / "manifest.json")
    (run / "metrics.json").write_text("[" * 100_000 + "]" * 100_000)
    laughs = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for p, n in zip("abcdefgh", "bcdefghi", strict=True):
        laughs.append(f"{n}: &{n} [" + ", ".join([f"*{p}"] * 9) + "]")
    (run / ".hydra" / "config.yaml").write_text("\n".join(laughs) + "\n")
    result, peak = measured("gptlab-eval", f"ckpt_path={run}", "device=cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "not a run directory of yours" in result.stderr and peak < 1 << 30
    assert files.read_json(run / "metrics.json") is None
    assert files.read_yaml(run / ".hydra" / "config.yaml") is None
    assert files.read_bytes(run / "manifest.json") is None  # returns at once: not waited on
    [written] = (tmp_path / "outputs" / "eval").rglob("eval.json")
    assert json.loads(written.read_text())


@pytest.mark.parametrize("flag", ["--help", "-h", "--cfg=job", "-c=job", "--info"])
def test_a_command_line_that_only_prints_makes_nothing(tmp_path, flag):
    result = run_main(flag, cwd=tmp_path)
    assert result.returncode == 0 and os.listdir(tmp_path) == []
