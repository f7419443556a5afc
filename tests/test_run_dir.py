"""The run directory: its layout, the recorded settings a resume re-applies (as data), and the
crash windows around a run's end, with one finished debug=fast run copied per test. What a
directory from anyone else can and cannot do is tests/test_foreign.py's."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest
from helpers import check, own_copy, read_metrics, run_cli, run_main
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from gptlab import files
from gptlab.errors import ConfigError
from gptlab.run import directory, ownership
from gptlab.run.overrides import literal, quote
from gptlab.run.settings import literal_node, replay_override, replayable

FAST = ["debug=fast", "trainer.max_steps=20"]
SECRET = "s3cr3t-gptlab-token"


@pytest.fixture
def copy(finished, tmp_path) -> Path:
    """The finished run, the user's own at a place of this test's."""
    return own_copy(finished, tmp_path / "handed" / "run")


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------ unit: the layout and its checks


def test_the_layout_lives_in_one_place(tmp_path):
    assert directory.last_checkpoint(tmp_path) == tmp_path / "checkpoints" / "last.ckpt"
    assert directory.best_checkpoint(tmp_path) == tmp_path / "checkpoints" / "best.ckpt"
    assert directory.metrics_file(tmp_path) == tmp_path / "metrics.json"
    assert directory.saved_config(tmp_path) == tmp_path / ".hydra" / "config.yaml"
    later = directory.later_start_subdir()
    assert later.startswith(".hydra/resume-") and later != directory.later_start_subdir()


def test_a_start_continues_with_resume_or_a_requeue_and_a_last_checkpoint(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert not directory.continues(tmp_path, resume="x")  # nothing to continue from
    directory.last_checkpoint(tmp_path).parent.mkdir()
    directory.last_checkpoint(tmp_path).write_bytes(b"ckpt")
    assert directory.continues(tmp_path, resume="x")
    assert not directory.continues(tmp_path, resume=None)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert directory.continues(tmp_path, resume=None)
    assert directory.holds_run(tmp_path)
    with pytest.raises(ConfigError, match="resume="):
        directory.refuse_fresh_run_over(tmp_path)


def test_write_text_replaces_a_symlink_and_leaves_its_target(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").symlink_to(outside)
    files.write_text(tmp_path / "run" / "metrics.json", "{}\n")
    assert outside.read_text() == "precious"
    assert not (tmp_path / "run" / "metrics.json").is_symlink()
    assert (tmp_path / "run" / "metrics.json").read_text() == "{}\n"
    assert files.read_json(tmp_path / "run" / "metrics.json") == {}
    (tmp_path / "link.json").symlink_to(tmp_path / "run" / "metrics.json")
    assert files.read_json(tmp_path / "link.json") is None  # never read through a link


def test_a_write_follows_the_umask_and_a_failed_one_leaves_nothing(tmp_path):
    previous = os.umask(0o022)
    try:
        files.write_text(tmp_path / "a.json", "{}")
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        files.write_text(tmp_path / "b.json", "{}")
        assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(previous)
    with pytest.raises(ZeroDivisionError), files.atomic(tmp_path / "c.json") as f:
        f.write("half")
        raise ZeroDivisionError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]


def test_a_start_removes_the_temporary_files_its_run_recorded_and_nothing_else(copy):
    """A kill while a file was written leaves its temporary file, recorded in the manifest: the
    next start removes it. What the manifest did not record (planted, or not gptlab's) stays,
    a planted folder of the same shape included."""
    manifest = ownership.Manifest.load(copy)
    recorded = copy / "checkpoints" / ".last.ckpt.x1y2.tmp"
    recorded.write_bytes(b"half a checkpoint")
    manifest.data[ownership.TEMPORARY] = ["checkpoints/.last.ckpt.x1y2.tmp"]
    manifest.save()
    planted = copy / ".metrics.json.a8b9.tmp"
    planted.write_text("{")
    (copy / ".x.tmp").mkdir()
    ownership.claim(copy, None)
    assert not recorded.exists() and planted.read_text() == "{" and (copy / ".x.tmp").is_dir()
    assert ownership.Manifest.load(copy).data[ownership.TEMPORARY] == []


@pytest.mark.parametrize("plant", ["symlink", "hard link", "fifo", "wandb elsewhere"])
def test_a_start_refuses_a_run_holding_links_or_special_files(copy, tmp_path, plant):
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's")
    if plant == "symlink":
        (copy / "tensorboard" / "events").symlink_to(outside)
    elif plant == "hard link":
        os.link(outside, copy / "train.log.1")
    elif plant == "fifo":
        os.mkfifo(copy / "metrics.fifo")
    else:  # only the run's top-level wandb/ may hold W&B's links, and they stay in the run
        (copy / "tensorboard" / "wandb").mkdir()
        (copy / "tensorboard" / "wandb" / "latest-run").symlink_to(copy / "metrics.json")
    with pytest.raises(ConfigError, match="not one gptlab made here for you"):
        ownership.claim(copy, None)
    assert outside.read_text() == "the user's"


def test_w_and_bs_own_links_inside_the_run_are_allowed(copy, tmp_path):
    (copy / "wandb" / "run-1" / "files").mkdir(parents=True)
    (copy / "wandb" / "latest-run").symlink_to(copy / "wandb" / "run-1")
    (copy / "wandb" / "run-1" / "files" / "metrics.json").symlink_to(copy / "metrics.json")
    ownership.check_run(copy)
    (copy / "wandb" / "debug.log").symlink_to(tmp_path / "elsewhere.log")  # out of the run
    with pytest.raises(ownership.ForeignDirectory, match="symlink"):
        ownership.check_run(copy)


# ------------------------------------------------------------ unit: recorded settings, as data


@pytest.mark.parametrize(
    "override",
    [
        "experiment=../../../../tmp/x/evil",
        "experiment=no_such_option",
        "logger=[tensorboard,../../x]",
        "paths.output_dir=/elsewhere",
        "trainer.default_root_dir=/elsewhere",
        "data.url=http://127.0.0.1:1/${oc.env:SECRET}/book.txt",
        "data.url='${oc.env:SECRET}'",
        "+callbacks.x._target_=builtins.print",
        "callbacks.text_sample._target_=builtins.print",
        "trainer.profiler={_target_:builtins.print}",
        "hydra.callbacks.x._target_=builtins.open",
        "~callbacks.text_sample",
        "logger.tensorboard.name=../..",
        "logger.mlflow.artifact_location=/elsewhere",
        "model.d_model=${oc.decode:'64'}",
        'sample_prompt="a\\\'b"',
        "optim.betas=[0.9,${oc.env:B}]",
        "optim.branch_at=[a,b]",
    ],
)
def test_a_recorded_setting_that_is_not_data_is_dropped(override):
    assert replay_override(override) == (None, override)


@pytest.mark.parametrize(
    ("override", "value"),
    [
        ("trainer.max_steps=35", 35),
        ("model.dropout=0.1", 0.1),
        ("optim.lr=1e-3", 0.001),
        ("trainer.deterministic=true", True),
        ("trainer.gradient_clip_val=null", None),
        ("data.url=https://example.org/a.txt", "https://example.org/a.txt"),
        ("data.path='/data/my file.txt'", "/data/my file.txt"),
        ('sample_prompt="It\'s a deal"', "It's a deal"),
        ("debug=fast", "fast"),
        ("logger=[tensorboard,csv]", ["tensorboard", "csv"]),
        ("optim.branch_at=[0.25, 0.5,1e-1]", [0.25, 0.5, 0.1]),
        ("optim.branch_at=[]", []),
    ],
)
def test_a_literal_is_re_emitted_so_that_hydra_reads_the_same_value(override, value):
    kept, dropped = replay_override(override)
    assert dropped is None
    assert OverridesParser.create().parse_override(kept).value() == value


@pytest.mark.parametrize(
    "text", ["plain", "it's", "a\\b", "ends\\", "\\'", "${oc.env:HOME}", "\\${x}", "'\"${", ""]
)
def test_a_quoted_string_reads_back_as_itself(text):
    """Hydra resolves `${` inside quoted strings too: quote() escapes it with the quotes."""
    parsed = OverridesParser.create().parse_override(f"key={quote(text)}")
    assert OmegaConf.create({"key": parsed.value()}).key == text


def test_resume_and_ckpt_path_are_not_re_applied_and_not_named(capsys):
    assert replayable(["resume=/a", "ckpt_path=/b", "seed=3"], "here") == ["seed=3"]
    assert capsys.readouterr().err == ""
    assert replayable(["seed=3", "paths.output_dir=/x", "experiment=../e"], "here") == ["seed=3"]
    [line] = capsys.readouterr().err.splitlines()
    assert "paths.output_dir=/x" in line and "experiment=../e" in line


def test_a_saved_config_node_keeps_only_literals():
    node = {"url": "http://h/${oc.env:S}/b.txt", "batch_size": 8, "x": {"_target_": "os.system"}}
    assert literal_node(node, "data") == ({"batch_size": 8}, ["data.url", "data.x"])
    assert literal("'${oc.env:S}'") is None


def test_a_fresh_run_into_a_finished_run_is_refused(copy, tmp_path):
    before = tree_bytes(copy)
    result = run_main(*FAST, f"hydra.run.dir={copy}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"resume={copy}" in result.stderr and "Traceback" not in result.stderr
    assert tree_bytes(copy) == before  # checkpoints, metrics and .hydra/ byte-identical


def test_checkpoints_go_where_resume_looks_not_to_a_setting(tmp_path):
    result = run_main(*FAST, "callbacks.last_checkpoint.dirpath=/tmp/x", cwd=tmp_path)
    assert result.returncode == 2
    assert "dirpath" in result.stderr
    assert not list(tmp_path.rglob("*.ckpt"))


# ------------------------------------------------------------------------------- crash windows


def finite_metrics(run_dir: Path) -> dict:
    metrics = read_metrics(run_dir)
    numbers = [v for v in metrics.values() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers), metrics
    return metrics


def test_killed_before_metrics_json_resume_restores_them(finished, tmp_path):
    """The window between the final checkpoint and metrics.json (a kill at the end of a run), as
    the issue names it: metrics.json of a finished run deleted, then resume=; in a directory
    whose name Hydra's grammar would misread."""
    run_dir = own_copy(finished, tmp_path / "it's a run")
    (run_dir / "metrics.json").unlink()
    check(run_main(f"resume={run_dir}", cwd=tmp_path))
    whole = read_metrics(finished)
    restored = finite_metrics(run_dir)
    for key in ("best_val_loss", "final_val_loss", "best_val_bpb", "final_val_bpb"):
        assert abs(restored[key] - whole[key]) <= 1e-6, key
    assert restored["tokens_seen"] == whole["tokens_seen"] > 0
    assert restored["steps"] == whole["steps"] == 20


def test_a_directory_named_with_an_interpolation_is_refused_clearly(finished, tmp_path):
    run_dir = tmp_path / "run ${oc.env:GPTLAB_TEST_SECRET}"
    shutil.copytree(finished, run_dir)
    before = tree_bytes(run_dir)
    result = run_main(f"resume={run_dir}", cwd=tmp_path, env={"GPTLAB_TEST_SECRET": SECRET})
    assert result.returncode == 2 and "Rename it" in result.stderr
    assert "Traceback" not in result.stderr and SECRET not in result.stderr
    assert tree_bytes(run_dir) == before


def test_a_sweep_job_killed_before_metrics_json_is_repaired_by_resume(tmp_path):
    sweep = tmp_path / "sweep"
    grid = ["-m", *FAST, "trainer.max_steps=10", "model.num_heads=1,2", f"hydra.sweep.dir={sweep}"]
    check(run_main(*grid, cwd=tmp_path))
    whole = read_metrics(sweep / "0")
    kept = (sweep / "1" / "metrics.json").read_bytes()
    (sweep / "0" / "metrics.json").unlink()

    refused = run_main(*grid, cwd=tmp_path)  # the same sweep again, fresh: refused
    assert refused.returncode == 2 and f"resume={sweep}" in refused.stderr
    check(run_main(f"resume={sweep}", cwd=tmp_path))
    repaired = finite_metrics(sweep / "0")
    assert repaired["status"] == "ok"
    assert abs(repaired["best_val_loss"] - whole["best_val_loss"]) <= 1e-6
    assert (sweep / "1" / "metrics.json").read_bytes() == kept  # the finished job was kept
    assert "2 ok, 0 failed" in (sweep / "summary.md").read_text()


# -------------------------------------------------------------------------------- small items


def assert_one_output_folder(cwd: Path, tool: str) -> None:
    """The tool's outputs/<tool>/<date>/<time>, holding its output; no empty folder elsewhere."""
    assert os.listdir(cwd / "outputs") == [tool]
    folders = [p for p in (cwd / "outputs").rglob("*") if p.is_dir() and p.name != ".hydra"]
    leaves = [p for p in folders if not any(q.is_dir() and q.name != ".hydra" for q in p.iterdir())]
    assert len(leaves) == 1 and any(leaves[0].iterdir()), folders


def test_inspect_leaves_no_empty_run_folders(finished, tmp_path):
    check(
        run_cli(f"ckpt_path={finished}", "tensorboard=false", tool="gptlab-inspect", cwd=tmp_path)
    )
    assert_one_output_folder(tmp_path, "inspect")
