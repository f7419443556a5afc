"""The trust battery: directories from anyone else, planted as an attacker would (a copied run, an
edited or planted file, a symlink, a crafted checkpoint, a crafted study), run through every tool.
Each test asserts what the boundary promises (gptlab.run.ownership): a foreign directory is never
continued in place and is read for its checkpoint's tensors only; nothing is written into it or
outside it; no connection is opened; no secret reaches any output. The runs the tests make
themselves are this session's user's own (tests/conftest.py: its signing key)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from helpers import LocalServer, check, own_copy, read_metrics, run_main

from gptlab.errors import ConfigError
from gptlab.run import ownership
from gptlab.run.restore import own_state
from gptlab.training.checkpoint_io import RunCheckpointIO

FAST = ["debug=fast", "trainer.max_steps=20", "trainer.limit_val_batches=1.0"]
SECRET = "s3cr3t-gptlab-token"
ENV = {"GPTLAB_TEST_SECRET": SECRET}


@pytest.fixture
def server(monkeypatch):
    """A local HTTP server that records every request: a connection anything opened."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    local = LocalServer()
    yield local
    local.close()


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file's bytes and every link's target under `root`: what must not change."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


def precious(tmp_path: Path, name: str) -> Path:
    """A folder outside every run, holding a file: what an attacker wants deleted or written."""
    victim = tmp_path / name
    victim.mkdir()
    (victim / "thesis.txt").write_text("years of work\n")
    return victim


def assert_untouched(victim: Path) -> None:
    assert (victim / "thesis.txt").read_text() == "years of work\n"
    assert sorted(p.name for p in victim.iterdir()) == ["thesis.txt"]


def craft(checkpoint_file: Path, remembered: str, server: LocalServer) -> None:
    """Rewrite Lightning's ModelCheckpoint state in a checkpoint so that its next "better model"
    removes `remembered` (the kth best), and its best model is fetched from `server`."""
    checkpoint = torch.load(checkpoint_file, weights_only=True)
    for state in checkpoint["callbacks"].values():
        if "best_k_models" in state and state["monitor"] == "val/loss":
            state["dirpath"] = str(checkpoint_file.parent)  # Lightning restores it all then
            state["best_k_models"] = {remembered: torch.tensor(100.0)}
            state["kth_best_model_path"] = remembered
            state["kth_value"] = torch.tensor(100.0)
            state["best_model_score"] = torch.tensor(100.0)
            state["best_model_path"] = server.url("/best.ckpt")
            state["last_model_path"] = server.url("/last.ckpt")
    torch.save(checkpoint, checkpoint_file)


def remembered_forms(victim: Path, run_dir: Path, server: LocalServer) -> list[str]:
    """The forms a remembered path takes to reach outside: another protocol (fsspec removes
    recursively), a climb out of checkpoints/, a URL (fetched), a plain absolute path."""
    climb = f"{run_dir}/checkpoints/../../{os.path.relpath(victim, run_dir.parent)}"
    return [f"local://{victim}", climb, server.url("/remembered"), str(victim)]


# ----------------------------------------------------------------- crafted checkpoints


def test_a_crafted_checkpoint_in_a_copied_run_is_refused_or_read_for_its_tensors(
    finished, tmp_path, server
):
    victim = precious(tmp_path, "victim")
    copy = tmp_path / "downloaded" / "run"
    shutil.copytree(finished, copy)
    craft(copy / "checkpoints" / "last.ckpt", f"local://{victim}", server)
    before = snapshot(copy)

    resumed = run_main(f"resume={copy}", cwd=tmp_path)
    assert resumed.returncode == 2, resumed.stderr[-2000:]
    assert "not a run directory gptlab made here for you" in resumed.stderr
    assert "a copy or a move" in resumed.stderr and "ckpt_path=" in resumed.stderr
    requeued = run_main(
        *FAST, f"hydra.run.dir={copy}", cwd=tmp_path, env={"SLURM_RESTART_COUNT": "1"}
    )
    assert requeued.returncode == 2 and "ckpt_path=" in requeued.stderr

    new = tmp_path / "mine"
    trained = check(
        run_main(
            f"ckpt_path={copy}", *FAST, "trainer.max_steps=30", f"hydra.run.dir={new}", cwd=tmp_path
        )
    )
    assert read_metrics(new)["steps"] == 30  # on from the copy's step 20, in a new directory
    assert "Traceback" not in trained.stderr
    assert_untouched(victim)
    assert server.hits == []
    assert snapshot(copy) == before  # read, never written
    ownership.check_run(new)  # the new run is the user's own


def test_an_own_run_forgets_remembered_paths_outside_its_checkpoints(finished, tmp_path, server):
    """Defence in depth for the user's own runs: a checkpoint whose ModelCheckpoint state names
    paths outside the run (say, written by another tool) is continued with those forgotten."""
    victim = precious(tmp_path, "victim")
    own = own_copy(finished, tmp_path / "own")
    craft(own / "checkpoints" / "last.ckpt", f"local://{victim}", server)
    manifest = ownership.Manifest.load(own)
    manifest.record("checkpoints/last.ckpt")  # accepted as the run's own
    manifest.save()
    result = check(run_main(f"resume={own}", "trainer.max_steps=40", cwd=tmp_path))
    assert_untouched(victim)
    assert server.hits == []
    assert "they are forgotten, never deleted or read" in result.stderr
    assert read_metrics(own)["steps"] == 40


def test_the_checkpoint_plugin_removes_and_loads_only_the_runs_own(finished, tmp_path, server):
    """Each form a remembered path takes: forgotten when the state is restored, and neither
    removed nor loaded by the plugin every checkpoint passes through."""
    victim = precious(tmp_path, "victim")
    run = own_copy(finished, tmp_path / "run")
    forms = remembered_forms(victim, run, server)
    state = {"best_k_models": dict.fromkeys(forms, 1.0), "kth_best_model_path": forms[1]}
    state.update(best_model_path=forms[0], last_model_path=forms[2])
    kept = own_state({"callbacks": {"ModelCheckpoint{}": state}}, run)["callbacks"]
    assert kept["ModelCheckpoint{}"]["best_k_models"] == {}
    assert not any(kept["ModelCheckpoint{}"][k] for k in ("best_model_path", "kth_best_model_path"))
    plugin = RunCheckpointIO(run)
    (run / "checkpoints" / "link.ckpt").symlink_to(victim / "thesis.txt")
    for path in [*forms, victim / "thesis.txt", run / "checkpoints" / "link.ckpt", run]:
        plugin.remove_checkpoint(path)
        with pytest.raises(ConfigError, match="gptlab did not choose"):
            plugin.load_checkpoint(path)
    assert_untouched(victim)
    assert server.hits == []
    plugin.remove_checkpoint(run / "checkpoints" / "best.ckpt")  # not saved by this process
    assert (run / "checkpoints" / "best.ckpt").is_file()
    plugin.save_checkpoint({"step": 1}, run / "checkpoints" / "other.ckpt")
    plugin.remove_checkpoint(run / "checkpoints" / "other.ckpt")  # its own save: removed
    assert not (run / "checkpoints" / "other.ckpt").exists()


# ------------------------------------------------------- edited, planted and linked files


def plant_evil_experiment(tmp_path: Path) -> tuple[str, Path]:
    """A real YAML outside the config tree whose hydra.callbacks would create a marker file."""
    import importlib.resources

    marker = tmp_path / "PWNED"
    evil = tmp_path / "x" / "evil.yaml"
    evil.parent.mkdir()
    evil.write_text(
        "# @package _global_\n"
        f"hydra:\n  callbacks:\n    evil:\n      _target_: builtins.open\n"
        f"      file: {marker}\n      mode: w\n"
    )
    experiment_dir = importlib.resources.files("gptlab.conf") / "experiment"
    climb = "../" * (len(Path(str(experiment_dir)).parts) - 1)  # up to /
    return f"experiment={climb}{str(evil.with_suffix(''))[1:]}", marker


def evil_overrides(tmp_path: Path, server: LocalServer) -> tuple[list[str], Path]:
    traversal, marker = plant_evil_experiment(tmp_path)
    overrides = [
        *FAST,
        traversal,
        f"paths.output_dir={tmp_path / 'elsewhere'}",
        f"data.url={server.url('/${oc.env:GPTLAB_TEST_SECRET}/sales_textbook.txt')}",
        "data.sha256=null",
        "logger.tensorboard.name=../../..",
        "+callbacks.evil._target_=builtins.print",
    ]
    return overrides, marker


def edit(run: Path, what: str, tmp_path: Path, server: LocalServer) -> None:
    """One planted change to an own run directory, as anyone with a copy could make."""
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    if what == "overrides":
        overrides, _ = evil_overrides(tmp_path, server)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    elif what == "checkpoint":
        with (run / "checkpoints" / "last.ckpt").open("ab") as f:
            f.write(b"\0")
    elif what == "planted checkpoint":
        shutil.copy(run / "checkpoints" / "best.ckpt", run / "checkpoints" / "hpc_ckpt_1.ckpt")
    elif what == "metrics":
        (run / "metrics.json").write_text('{"status": "ok", "best_val_loss": 0.1}\n')
    elif what == "manifest":
        text = (run / "manifest.json").read_text().replace('"run"', '"sweep"')
        (run / "manifest.json").write_text(text)
    else:  # a symlink under a name gptlab writes or reads
        (run / what).parent.mkdir(parents=True, exist_ok=True)
        if (run / what).is_dir():
            shutil.rmtree(run / what)
        (run / what).unlink(missing_ok=True)
        (run / what).symlink_to(outside)


EDITS = [
    "overrides",
    "checkpoint",
    "planted checkpoint",
    "metrics",
    "manifest",
    "train.log",
    "tensorboard/events.out.tfevents.1.host.0.hparams",  # the HPARAMS file a start replaces
    ".hydra/resume-2026-01-01_00-00-00",
    "checkpoints/.last.ckpt.tmp",
]


@pytest.mark.parametrize("what", EDITS)
def test_an_edited_planted_or_linked_file_makes_an_own_run_foreign(
    finished, tmp_path, server, what
):
    run = own_copy(finished, tmp_path / "run")
    edit(run, what, tmp_path, server)
    before = snapshot(run)
    for env in ({}, {"SLURM_RESTART_COUNT": "1"}):  # resume=, and a requeue of the same run
        args = [f"resume={run}"] if not env else [*FAST, f"hydra.run.dir={run}"]
        result = run_main(*args, cwd=tmp_path, env={**ENV, **env})
        assert result.returncode == 2, (what, result.stderr[-2000:])
        assert "not a run directory gptlab made here for you" in result.stderr
        assert "Traceback" not in result.stderr and SECRET not in result.stderr + result.stdout
    assert snapshot(run) == before
    assert (tmp_path / "outside.txt").read_text() == "precious\n"
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "elsewhere").exists()
    assert server.hits == []


def test_a_planted_start_folder_is_never_read(finished, tmp_path, server):
    """Files no manifest recorded are not relied upon: a start folder planted under .hydra/ in
    the user's own run is left out of what resume= replays (it never wins as "newest")."""
    run = own_copy(finished, tmp_path / "run")
    planted = run / ".hydra" / "resume-2099-01-01_00-00-00-deadbeef"
    planted.mkdir()
    overrides, marker = evil_overrides(tmp_path, server)
    (planted / "overrides.yaml").write_text(yaml.safe_dump([*overrides, "trainer.max_steps=999"]))
    check(run_main(f"resume={run}", "trainer.max_steps=25", cwd=tmp_path, env=ENV))
    assert read_metrics(run)["steps"] == 25
    assert not marker.exists() and not (tmp_path / "elsewhere").exists()
    assert server.hits == []


# ------------------------------------------------------------- eval, generate and inspect


def test_eval_generate_and_inspect_read_a_foreign_run_for_its_tensors_only(
    finished, tmp_path, server
):
    """A copy whose saved config names a download carrying a secret, and whose checkpoints/ is a
    link into the user's own run: eval scores the val split exactly as the owner's eval does,
    from the checkpoint's tensors and the default data settings; nothing is written into either
    directory; nothing is fetched."""
    owner = own_copy(finished, tmp_path / "owner")
    own_eval = check(run_main(f"ckpt_path={owner}", tool="gptlab-eval", cwd=tmp_path))
    stranger = tmp_path / "stranger"
    shutil.copytree(finished, stranger)
    config = yaml.safe_load((stranger / ".hydra" / "config.yaml").read_text())
    config["data"].update(
        url=server.url("/${oc.env:GPTLAB_TEST_SECRET}/book.txt"), sha256=None, val_fraction=0.5
    )
    (stranger / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    shutil.rmtree(stranger / "checkpoints")
    (stranger / "checkpoints").symlink_to(owner / "checkpoints")
    before = {"owner": snapshot(owner), "stranger": snapshot(stranger)}

    foreign_eval = check(
        run_main(f"ckpt_path={stranger}", tool="gptlab-eval", cwd=tmp_path, env=ENV)
    )
    loss = [line for line in own_eval.stdout.splitlines() if line.startswith("val loss")]
    assert loss and loss == [
        line for line in foreign_eval.stdout.splitlines() if "val loss" in line
    ]
    assert "Written: " + str(tmp_path / "outputs" / "eval") in foreign_eval.stdout
    check(run_main(f"ckpt_path={stranger}", "num_samples=1", tool="gptlab-generate", cwd=tmp_path))
    check(run_main(f"ckpt_path={stranger}", tool="gptlab-inspect", cwd=tmp_path))
    assert {"owner": snapshot(owner), "stranger": snapshot(stranger)} == before
    assert server.hits == []
    for result in (foreign_eval,):
        assert SECRET not in result.stdout + result.stderr


def evil_pickle(marker: Path) -> dict:
    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    return {"state_dict": {}, "x": Evil()}


@pytest.mark.parametrize(
    "tool", ["gptlab-eval", "gptlab-generate", "gptlab-inspect", "gptlab-train"]
)
def test_a_checkpoint_holding_objects_or_bad_settings_is_refused_clearly(finished, tmp_path, tool):
    marker = tmp_path / "PWNED"
    pickled = tmp_path / "pickled.ckpt"
    torch.save(evil_pickle(marker), pickled)
    checkpoint = torch.load(finished / "checkpoints" / "best.ckpt", weights_only=True)
    bad_settings = {
        "unknown.ckpt": {"_target_": "os.system"},
        "typed.ckpt": {"d_model": "64"},
    }
    cases = {pickled: "never unpickles"}
    for name, change in bad_settings.items():
        crafted = {**checkpoint, "hyper_parameters": {**checkpoint["hyper_parameters"]}}
        crafted["hyper_parameters"]["model"] = {**crafted["hyper_parameters"]["model"], **change}
        torch.save(crafted, tmp_path / name)
        cases[tmp_path / name] = "does not hold a gptlab model"
    for path, phrase in cases.items():
        extra = [*FAST, f"hydra.run.dir={path.with_suffix('')}"] if tool == "gptlab-train" else []
        result = run_main(f"ckpt_path={path}", *extra, cwd=tmp_path, tool=tool)
        assert result.returncode == 2, (path, result.stderr[-2000:])
        assert phrase in result.stderr and "weights_only=False" not in result.stderr
        assert "Traceback" not in result.stderr
    assert not marker.exists()


# ------------------------------------------------------------------------------- sweeps


def fake_sweep(place: Path, server: LocalServer, key_file: Path | None) -> Path:
    """A sweep directory as a stranger could hand it over: its multirun.yaml naming another
    study storage, a study whose trial names a job directory outside, a finished job, a link;
    signed with `key_file` (another user's key), or unsigned."""
    import optuna

    place.mkdir(parents=True)
    hydra = {
        "sweeper": {
            "_target_": "hydra_plugins.gptlab_optuna_sweeper.sweeper.GptlabOptunaSweeper",
            "storage": f"postgresql://127.0.0.1:{server.port}/evil",
            "study_name": "evil",
        },
        "overrides": {"task": ["+callbacks.x._target_=builtins.print", *FAST]},
    }
    (place / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra}))
    study = optuna.create_study(storage=f"sqlite:///{place / 'optuna.db'}", study_name="gptlab")
    trial = study.ask()
    trial.set_user_attr("job", "../../escape")
    (place / "0" / ".hydra").mkdir(parents=True)
    (place / "0" / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["seed=1"]))
    (place / "0" / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": 1}))
    (place / "0" / "metrics.json").write_text('{"status": "ok", "best_val_loss": 1.0}\n')
    if key_file is not None:
        saved = os.environ["GPTLAB_KEY_FILE"]
        os.environ["GPTLAB_KEY_FILE"] = str(key_file)
        try:
            ownership.record_sweep(place, overrides=hydra["overrides"]["task"])
        finally:
            os.environ["GPTLAB_KEY_FILE"] = saved
    return place


def test_a_foreign_sweep_is_not_resumed_and_its_report_is_written_elsewhere(tmp_path, server):
    from scripts.sweep_report import main as sweep_report

    for signer in (tmp_path / "their key", None):
        sweep = fake_sweep(tmp_path / f"sweep-{signer is None}", server, signer)
        outside = tmp_path / "outside.md"
        outside.write_text("precious\n")
        (sweep / "summary.md").symlink_to(outside)
        before = snapshot(sweep)
        result = run_main(f"resume={sweep}", cwd=tmp_path)
        assert result.returncode == 2, result.stderr[-2000:]
        assert "A foreign sweep cannot be resumed" in result.stderr
        os.chdir(tmp_path)
        try:
            assert sweep_report([str(sweep)]) == 0
        finally:
            os.chdir(Path(__file__).parent.parent)
        assert snapshot(sweep) == before and outside.read_text() == "precious\n"
        assert list((tmp_path / "outputs" / "sweep_report").rglob("summary.md"))
    assert server.hits == [] and not (tmp_path.parent / "escape").exists()


def test_an_own_sweep_with_a_link_or_an_edited_study_is_foreign(tmp_path, server):
    sweep = fake_sweep(tmp_path / "sweep", server, None)
    (sweep / "0" / "metrics.json").unlink()  # a job that never got as far as its results
    ownership.record_sweep(sweep, overrides=FAST)
    ownership.record_study(sweep, is_open=False)
    ownership.check_sweep(sweep)  # own, as made
    (sweep / "optuna.db").write_bytes((sweep / "optuna.db").read_bytes() + b"\0")
    with pytest.raises(ownership.ForeignDirectory, match="optuna.db"):
        ownership.check_sweep(sweep)
    ownership.record_study(sweep, is_open=False)
    (sweep / "0" / "checkpoints").mkdir()
    (sweep / "0" / "checkpoints" / "last.ckpt").symlink_to(tmp_path / "outside.ckpt")
    with pytest.raises(ownership.ForeignDirectory, match="symlink"):
        ownership.check_sweep(sweep)


# ---------------------------------------------------- kill -9 between writing and recording


@pytest.mark.parametrize("moment", ["before the rename", "after the rename"])
def test_a_kill_between_writing_a_file_and_recording_it_keeps_the_run_own(
    finished, tmp_path, moment
):
    """SIGKILL at the two moments around a checkpoint's rename: the manifest accepts the file on
    disk either way, so the run stays the user's own (the next resume= continues it)."""
    run = own_copy(finished, tmp_path / "run")
    target = run / "checkpoints" / "last.ckpt"
    script = textwrap.dedent(f"""
        import os, signal
        from gptlab import files
        from gptlab.run import ownership
        real = os.replace
        def replace(src, dst):  # the manifest is written first: the kill waits for the file
            if str(dst) == {str(target)!r} and {moment == "before the rename"}:
                os.kill(os.getpid(), signal.SIGKILL)
            real(src, dst)
            if str(dst) == {str(target)!r}:
                os.kill(os.getpid(), signal.SIGKILL)
        files.os.replace = replace
        write = lambda f: f.write(b"new")
        ownership.write_recorded({str(run)!r}, "checkpoints/last.ckpt", write, "wb")
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=os.environ, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    ownership.check_run(run)  # still own
    content = (run / "checkpoints" / "last.ckpt").read_bytes()
    assert (content == b"new") == (moment == "after the rename")
