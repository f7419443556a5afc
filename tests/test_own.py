"""Own or foreign, and the key (gptlab.run.ownership, gptlab.run.signing): a run gptlab made here
for this user continues in place; anything else (a copy, a move, a download) is read for its
checkpoint's weights only, and nothing is written into it. The key is checked as OpenSSH checks
a private key. The runs the tests make are this session's user's own (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
import yaml
from helpers import LocalServer, check, own_copy, read_metrics, run_main

from gptlab.run import ownership

FAST = ["debug=fast", "trainer.max_steps=20", "trainer.limit_val_batches=1.0"]
SECRET = "s3cr3t-gptlab-token"


def snapshot(root: Path) -> dict[str, bytes | str]:
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


@pytest.fixture
def server(monkeypatch):
    """A local HTTP server that records every request: a connection anything opened."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    local = LocalServer()
    yield local
    local.close()


def test_a_copy_is_foreign_read_for_its_weights_and_never_written(finished, tmp_path, server):
    copy = tmp_path / "downloaded" / "run"
    shutil.copytree(finished, copy)
    config = yaml.safe_load((copy / ".hydra" / "config.yaml").read_text())
    config["data"].update(url=server.url("/${oc.env:GPTLAB_TEST_SECRET}/book.txt"), sha256=None)
    (copy / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    before = snapshot(copy)
    env = {"GPTLAB_TEST_SECRET": SECRET}

    resumed = run_main(f"resume={copy}", cwd=tmp_path, env=env)
    assert resumed.returncode == 2 and "(a copy or a move)" in resumed.stderr
    assert "ckpt_path=" in resumed.stderr and len(resumed.stderr.strip().splitlines()) == 1
    requeued = run_main(
        *FAST, f"hydra.run.dir={copy}", cwd=tmp_path, env={"SLURM_RESTART_COUNT": "1"}
    )
    assert requeued.returncode == 2 and "ckpt_path=" in requeued.stderr

    new = tmp_path / "mine"
    check(run_main(f"ckpt_path={copy}", *FAST, f"hydra.run.dir={new}", cwd=tmp_path, env=env))
    assert read_metrics(new)["steps"] == 20  # a new run from its weights, at step 0
    assert read_metrics(new)["best_val_loss"] < read_metrics(finished)["best_val_loss"]
    assert ownership.own(new, "") == ownership.Own(new.resolve(), ownership.RUN)

    owner_eval = check(run_main(f"ckpt_path={finished}", tool="gptlab-eval", cwd=tmp_path))
    copy_eval = check(run_main(f"ckpt_path={copy}", tool="gptlab-eval", cwd=tmp_path, env=env))
    val = [line for line in owner_eval.stdout.splitlines() if line.startswith("val loss")]
    assert val and val == [line for line in copy_eval.stdout.splitlines() if "val loss" in line]
    assert "not your run" in copy_eval.stdout
    check(run_main(f"ckpt_path={copy}", "num_samples=1", tool="gptlab-generate", cwd=tmp_path))
    check(run_main(f"ckpt_path={copy}", tool="gptlab-inspect", cwd=tmp_path))
    assert snapshot(copy) == before
    assert server.hits == [] and SECRET not in copy_eval.stdout + copy_eval.stderr


def test_an_own_checkpoint_goes_on_whole_but_never_with_its_runs_callbacks(finished, tmp_path):
    """ckpt_path= of another run of the user's own: Lightning restores it whole (the step, the
    optimizer, the data's order), but not the paths its ModelCheckpoint remembers there, which
    it would remove as "no longer the best"."""
    first = own_copy(finished, tmp_path / "first")
    victim = tmp_path / "victim.txt"
    victim.write_text("years of work\n")
    last = first / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    for state in checkpoint["callbacks"].values():
        if "best_k_models" in state:
            state.update(
                best_k_models={str(victim): torch.tensor(100.0)}, kth_best_model_path=str(victim)
            )
            state.update(best_model_path=str(victim), best_model_score=torch.tensor(100.0))
    torch.save(checkpoint, last)
    before = snapshot(first)
    second = tmp_path / "second"
    check(
        run_main(
            f"ckpt_path={first}",
            *FAST,
            "trainer.max_steps=30",
            f"hydra.run.dir={second}",
            cwd=tmp_path,
        )
    )
    assert read_metrics(second)["steps"] == 30  # on from step 20
    assert victim.read_text() == "years of work\n" and snapshot(first) == before
    assert (second / "checkpoints" / "best.ckpt").is_file()


def test_a_branch_from_someone_elses_trunk_is_refused_with_the_way_on(finished, tmp_path):
    copy = tmp_path / "trunk"
    shutil.copytree(finished, copy)
    result = run_main(f"branch_from={copy}", "branch_step=10", cwd=tmp_path)
    assert result.returncode == 2 and "ckpt_path=" in result.stderr, result.stderr
    assert not (tmp_path / "outputs").exists()


def test_a_manifest_signed_for_another_place_or_with_another_key_is_foreign(finished, tmp_path):
    run = own_copy(finished, tmp_path / "run")
    assert ownership.own(run, "") == ownership.Own(run.resolve(), ownership.RUN)
    moved = tmp_path / "moved"
    run.rename(moved)
    assert "a copy or a move" in ownership.owner(moved.resolve()).why
    saved = os.environ["GPTLAB_KEY_FILE"]
    os.environ["GPTLAB_KEY_FILE"] = str(tmp_path / "theirs" / "key")
    try:
        theirs = own_copy(finished, tmp_path / "theirs-run")  # signed with their key
    finally:
        os.environ["GPTLAB_KEY_FILE"] = saved
    assert "not signed with your key" in ownership.owner(theirs.resolve()).why
    (moved / "manifest.json").unlink()
    assert "no manifest.json" in ownership.owner(moved.resolve()).why


# --------------------------------------------------------------------------------- the key


def key_result(tmp_path: Path, key: Path | str):
    return run_main(*FAST, cwd=tmp_path, env={"GPTLAB_KEY_FILE": str(key)})


def a_key(folder: Path, mode: int = 0o600) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    key = folder / "key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(mode)
    return key


def test_a_relative_key_path_is_refused(tmp_path):
    result = key_result(tmp_path, "key")
    assert result.returncode == 2 and "relative path" in result.stderr
    assert not (tmp_path / "key").exists() and not (tmp_path / "outputs").exists()


def test_a_key_others_can_read_write_swap_or_carry_is_refused(tmp_path):
    key = a_key(tmp_path / "keys")
    for mode in (0o640, 0o604, 0o620):
        key.chmod(mode)
        result = key_result(tmp_path, key)
        assert result.returncode == 2 and "chmod 600" in result.stderr, oct(mode)
    key.chmod(0o600)
    (tmp_path / "keys" / "link").symlink_to(key)
    assert "symlink" in key_result(tmp_path, tmp_path / "keys" / "link").stderr
    (tmp_path / "keys").chmod(0o777)  # a folder anyone can write: anyone can swap the key
    result = key_result(tmp_path, key)
    assert result.returncode == 2 and "can be written by others" in result.stderr
    (tmp_path / "keys").chmod(0o700)
    os.link(key, tmp_path / "second-name")
    result = key_result(tmp_path, key)
    assert result.returncode == 2 and "2 hard links" in result.stderr
    assert not (tmp_path / "outputs").exists()


def test_a_key_in_a_sticky_folder_such_as_tmp_is_used(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared").chmod(0o1777)
    key = a_key(tmp_path / "shared" / "mine")
    check(key_result(tmp_path, key))


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_key_of_another_user_is_refused(tmp_path):
    key = a_key(tmp_path / "keys")
    os.chown(key, 4242, 4242)
    result = key_result(tmp_path, key)
    assert result.returncode == 2 and "user id 4242" in result.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_key_folder_of_another_user_is_refused_as_theirs(tmp_path):
    key = a_key(tmp_path / "keys")
    os.chown(tmp_path / "keys", 4242, 4242)  # mode 700: no one else writes it, but 4242 can
    result = key_result(tmp_path, key)
    assert result.returncode == 2, result.stderr
    assert "belongs to user id 4242" in result.stderr and "written by others" not in result.stderr


def test_a_key_refused_for_its_folder_is_not_made_there(tmp_path):
    """A new key's folder is checked before the key is made: a refused key leaves nothing."""
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    result = key_result(tmp_path, tmp_path / "open" / "key")
    assert result.returncode == 2 and "can be written by others" in result.stderr
    assert not list((tmp_path / "open").iterdir())
    (tmp_path / "open").chmod(0o755)  # the fix the message gives works: the key is made
    check(key_result(tmp_path, tmp_path / "open" / "key"))
    assert stat.S_IMODE(os.stat(tmp_path / "open" / "key").st_mode) == 0o600


def test_a_key_inside_a_run_directory_is_refused(finished, tmp_path):
    run = own_copy(finished, tmp_path / "run")
    result = key_result(tmp_path, run / "key")
    assert result.returncode == 2 and "inside the run or sweep directory" in result.stderr
    assert not (run / "key").exists()
