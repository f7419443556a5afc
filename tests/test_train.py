"""gptlab-train end to end: composition, a complete run directory, clear failures."""

from __future__ import annotations

import fcntl
import math
import os
import pty
import re
import struct
import subprocess
import termios
import threading
from pathlib import Path

import gptlab.conf
import lightning as L
import pytest
import torch
import yaml
from helpers import BIN, check, read_metrics, run_main, scalars, tensorboard_runs, umask
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from gptlab.config.schemas import register_configs
from gptlab.data.datamodule import GPTDataModule
from gptlab.run import directory
from gptlab.run.checkpoints import load_model
from gptlab.run.screen import data_lines

register_configs()  # the config schemas and resolvers that composing conf/train.yaml needs
CONF = Path(gptlab.conf.__file__).parent


def composed(*overrides: str):
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        return compose("train", overrides=list(overrides))


def option_values(group: str, option: str) -> dict:
    """The plain values conf/<group>/<option>.yaml sets, by their key in the composed config
    (interpolations, mandatory values and the defaults list left out), as OmegaConf reads them."""
    path = CONF / group / f"{option}.yaml"
    package = "" if "# @package _global_" in path.read_text() else f"{group}."
    values = {}
    pending = [(package, OmegaConf.to_container(OmegaConf.load(path)))]
    while pending:
        prefix, node = pending.pop()
        for key, value in node.items():
            if key == "defaults":
                continue
            if isinstance(value, dict):
                pending.append((f"{prefix}{key}.", value))
            elif not (isinstance(value, str) and ("${" in value or value == "???")):
                values[f"{prefix}{key}"] = value
    return values


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory):
    """One debug=fast training run from a fresh working directory, shared by the checks below."""
    cwd = tmp_path_factory.mktemp("fast")
    run_dir = cwd / "run"
    with umask(0o022):  # files for a colleague to read: test_what_a_run_writes_...
        result = check(run_main("debug=fast", f"hydra.run.dir={run_dir}", cwd=cwd))
    return run_dir, result


def test_run_directory_is_complete(fast_run):
    run_dir, _ = fast_run
    for name in (
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
        "train.log",
        "metrics.json",
        "checkpoints/best.ckpt",
        "checkpoints/last.ckpt",
    ):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert "debug=fast" in (run_dir / ".hydra/overrides.yaml").read_text()
    assert "Best val loss" in (run_dir / "train.log").read_text()


def test_checkpoints_are_exactly_best_and_last(fast_run):
    run_dir, _ = fast_run
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 30  # the final weights, not the last periodic save


def test_best_checkpoint_exists_when_training_ends_before_the_first_validation(tmp_path):
    check(
        run_main(
            "debug=fast",
            "trainer.max_steps=7",
            "trainer.val_check_interval=20",
            "callbacks.last_checkpoint.every_n_train_steps=5",
            "hydra.run.dir=run",
            cwd=tmp_path,
        )
    )
    run_dir = tmp_path / "run"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    metrics = read_metrics(run_dir)
    assert metrics["steps"] == 7 and metrics["tokens_seen"] == 7 * 8 * 32
    assert metrics["best_val_loss"] == metrics["final_val_loss"]  # the final weights were validated
    val = scalars(run_dir / "tensorboard")["val/loss"]
    assert [step for step, _ in val] == [7]  # the step metrics.json names (Lightning's is 6)
    assert val[0][1] == pytest.approx(metrics["final_val_loss"], rel=1e-6)


def test_a_training_run_builds_its_gpt_once(tmp_path, monkeypatch):
    """GPT.__init__ runs once in a run (gptlab.model.meta.build_gpt: on torch's meta device, bounded
    there, then materialised), not once to bound the model and again to train it."""
    from gptlab.model.gpt import GPT

    built = []
    init = GPT.__init__

    def counted(self, config):
        built.append(config)
        init(self, config)

    monkeypatch.setattr(GPT, "__init__", counted)
    check(run_main("debug=fast", "trainer.max_steps=2", "hydra.run.dir=run", cwd=tmp_path))
    assert len(built) == 1 and read_metrics(tmp_path / "run")["steps"] == 2


def test_the_first_screen_shows_the_config_model_and_run_dir(fast_run):
    run_dir, result = fast_run
    before_training = result.stderr.split("Total Flops")[0]
    assert "d_model: 32" in before_training and "GPT: " in before_training
    assert f"Run directory: {run_dir}" in before_training
    assert "d_model: 32" in (run_dir / "config_tree.log").read_text()
    assert "a validation covers 1,024 of the 7,792 val tokens (trainer.limit_val_batches=4)" in (
        before_training  # debug=fast: 4 batches of 8 x 32 of the book's val split
    )


class ScoredTokens(L.LightningModule):
    """Counts the target tokens Lightning's validation feeds it."""

    scored = 0

    def validation_step(self, batch, batch_idx):
        self.scored += batch[1].numel()


@pytest.mark.parametrize("limit", [4, 0.5, 1.0])
def test_the_first_screen_says_what_a_validation_scores(corpus_path, tmp_path, limit):
    """trainer.limit_val_batches (batches, or a fraction of them) as Lightning's own validation
    scores the val split: the first screen's figure is the tokens it fed."""
    folders = {"data_dir": str(tmp_path), "cache_dir": str(tmp_path)}
    dm = GPTDataModule(path=str(corpus_path), batch_size=8, context_length=32, **folders)
    dm.prepare_data()
    dm.setup("fit")
    module = ScoredTokens()
    trainer = L.Trainer(limit_val_batches=limit, logger=False, enable_progress_bar=False)
    trainer.validate(module, datamodule=dm, verbose=False)
    [line] = data_lines(OmegaConf.create(), dm, trainer)
    val = len(dm.splits["val"])
    expected = f"{module.scored:,} of the {val:,} val tokens (trainer.limit_val_batches={limit})"
    if limit == 1.0:
        assert module.scored > val - 32 and line.endswith(f"covers all {val:,} val tokens")
    else:
        assert module.scored < val and line.endswith(f"covers {expected}")


def test_model_summary_counts_real_flops(fast_run):
    run_dir, _ = fast_run
    [line] = [
        line for line in (run_dir / "train.log").read_text().splitlines() if "Total Flops" in line
    ]
    count, unit = line.split()[:2]  # e.g. "69.1 M    Total Flops": one batch's forward pass
    assert float(count) > 0 and unit in ("K", "M", "B")


def test_metrics_json_is_sane(fast_run):
    run_dir, _ = fast_run
    m = read_metrics(run_dir)
    assert m["steps"] == 30
    assert m["tokens_seen"] == 30 * 8 * 32  # steps x batch x context (debug=fast)
    assert 0 < m["best_val_loss"] <= m["final_val_loss"] + 1e-6 < math.log(5000)
    assert m["best_val_perplexity"] == pytest.approx(math.exp(m["best_val_loss"]), rel=1e-6)
    model, _, _ = load_model(run_dir / "checkpoints" / "last.ckpt")  # the trained model, rebuilt
    assert m["num_params"] == sum(p.numel() for p in model.parameters())
    # training time (tokens / rate) is part of the wall time
    assert 0 < m["tokens_seen"] / m["tokens_per_sec"] <= m["wall_seconds"] * 1.01
    assert m["device"].startswith("cpu") and m["status"] == "ok" and m["slurm_job_id"] is None
    # bits per byte: the same val text, so bpb / loss is the constant tokens / (bytes * ln 2)
    assert 0 < m["best_val_bpb"] < m["best_val_loss"]
    assert m["best_val_bpb"] / m["best_val_loss"] == pytest.approx(
        m["final_val_bpb"] / m["final_val_loss"]
    )


def test_tensorboard_holds_one_run_with_its_curves_samples_and_hparams(fast_run):
    """`tensorboard --logdir <run dir>` finds one run, named by what it changes (as a sweep's
    job): the curves (no `epoch`), the text samples and the HPARAMS with the real results;
    validations at the steps metrics.json names."""
    run_dir, _ = fast_run
    assert tensorboard_runs(run_dir) == ["tensorboard/debug=fast"]
    tags = scalars(run_dir / "tensorboard")
    for tag in ("train/loss", "val/loss", "val/perplexity", "val/bpb", "vitals/lr/matrices"):
        assert tags.get(tag), f"missing scalar {tag}; have {sorted(tags)}"
    assert tags.get("vitals/tokens_per_sec") and "epoch" not in tags
    # TensorBoard shows groups (the tag up to its first /) in order: the losses come first
    assert sorted({tag.split("/")[0] for tag in tags})[:2] == ["train", "val"]
    metrics = read_metrics(run_dir)
    acc = EventAccumulator(str(directory.tensorboard_run(run_dir)), size_guidance={"tensors": 0})
    acc.Reload()
    val_steps = [step for step, _ in tags["val/loss"]]
    assert val_steps == [point[0] for point in metrics["val_curve"]] == [10, 20, 30]
    assert [event.step for event in acc.Tensors("samples/text_summary")] == val_steps
    best = metrics["best_val_loss"]
    assert tags["val_results/best_loss"] == [(30, pytest.approx(best, rel=1e-5))]  # never -1

    content = acc.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = session.session_start_info.hparams
    assert hparams["model/d_model"].number_value == 32
    assert hparams["data/encoding"].string_value == "cl100k_base"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    metric_tags = {m.name.tag for m in experiment.experiment.metric_infos}
    assert "val_results/best_loss" in metric_tags


def test_train_log_has_a_line_per_validation(fast_run):
    """nanoGPT's line at each validation, in train.log and on the console."""
    run_dir, result = fast_run
    line = re.compile(
        r"step (\d+)/30: train loss (\d+\.\d{4}), val loss (\d+\.\d{4}), val bpb (\d+\.\d{4}), "
        r"([\d,]+) tokens/s, (\d+:\d\d:\d\d) elapsed$"
    )
    found = [m for m in map(line.search, (run_dir / "train.log").read_text().splitlines()) if m]
    curve = read_metrics(run_dir)["val_curve"]
    assert [int(m[1]) for m in found] == [point[0] for point in curve]
    assert [float(m[3]) for m in found] == [round(point[2], 4) for point in curve]
    assert all(float(m[2]) > 0 and int(m[5].replace(",", "")) > 0 for m in found)
    assert result.stderr.count("val loss ") >= 3  # the console too


def train_fast(tmp_path, **streams) -> subprocess.CompletedProcess:
    """`gptlab-train debug=fast` on one thread, its output where `streams` say."""
    return subprocess.run(
        [str(BIN / "gptlab-train"), "debug=fast", "hydra.run.dir=run"],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
        **streams,
    )


def test_a_log_file_gets_plain_lines_not_a_progress_bar(tmp_path):
    """`gptlab-train debug=fast > log.txt 2>&1` (SLURM, CI, tee): stdout is no terminal, so a
    line every N steps instead of the bar, each validation's line whole, the log small."""
    log = tmp_path / "log.txt"
    with log.open("w") as out:
        train_fast(tmp_path, stdout=out, stderr=subprocess.STDOUT).check_returncode()
    text = log.read_text()
    assert log.stat().st_size < 20_000
    assert "\r" not in text and "it/s" not in text and "Validation" not in text  # no bar
    lines = text.splitlines()
    validation = re.compile(
        r"\[[\d-]+ [\d:,]+\]\[gptlab\.training\.run_stats\]\[INFO\] - step \d+/30: "
    )
    assert sum(bool(validation.match(line)) for line in lines) == 3  # one line each, whole
    progress = [line for line in lines if line.startswith("step ") and "elapsed" in line]
    assert len(progress) == 1  # every 100 steps and at the last one
    assert progress[0].startswith("step 30/30 (100%), 0:00:") and ", train/loss " in progress[0]
    assert "setuptools" not in text and "absent from the packages" not in text


def test_a_terminal_gets_the_progress_bar_not_lines(tmp_path):
    """The same run with stdout a terminal (a pseudo-terminal): Lightning's bar, counting steps."""
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 160 columns
    chunks = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    result = train_fast(tmp_path, stdout=terminal, stderr=subprocess.DEVNULL)
    os.close(terminal)
    reader.join(timeout=60)
    os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert result.returncode == 0
    assert re.search(r"\| 30/30 \[", text) and "it/s" in text
    assert not re.search(r"^step \d+/30 \(", text, re.M)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_trainer_gpu_without_a_gpu_names_trainer_cpu(tmp_path):
    result = run_main("debug=fast", "trainer=gpu", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "sees no CUDA GPU here. Train on the CPU with trainer=cpu" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_group_on_the_command_line_wins_and_debug_values_apply_after_it():
    """docs/configuration.md: `debug=fast model=modern` is modern's model (its 4 blocks and
    dropout 0.2) with debug=fast's width and heads; debug=fast alone picks model=tiny."""
    model = composed("debug=fast", "model=modern").model
    assert (model.d_model, model.num_heads, model.num_blocks, model.dropout) == (32, 2, 4, 0.2)
    assert model.positional == "rope" and model.qk_norm is True
    tiny = composed("debug=fast").model
    assert (tiny.num_blocks, tiny.dropout, tiny.positional) == (1, 0.0, "sinusoidal")


def test_what_a_run_writes_is_readable_by_group_and_others_under_umask_022(fast_run):
    run_dir, _ = fast_run  # trained under umask 022
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"metrics.json", "config_tree.log", "train.log", "best.ckpt", "manifest.json"} <= names
    assert any(".hparams" in name for name in names) and any("tfevents" in n for n in names)
    modes = {str(p.relative_to(run_dir)): oct(p.stat().st_mode & 0o777) for p in written}
    assert set(modes.values()) == {"0o644"}, modes


def test_the_end_tells_the_user_what_happened(fast_run):
    run_dir, result = fast_run
    out = result.stderr
    assert "Best val loss" in out and "perplexity" in out
    assert f"tensorboard --logdir {run_dir}" in out
    assert str(run_dir / "checkpoints" / "best.ckpt") in out
    assert "Sample: " in out and "The salesperson" in out.split("Sample: ")[1]


def test_cfg_job_prints_the_composed_config_from_any_directory(tmp_path):
    result = check(run_main("--cfg", "job", "model.num_heads=8", cwd=tmp_path))
    cfg = yaml.safe_load(result.stdout)
    assert cfg["model"]["num_heads"] == 8
    assert cfg["data"]["encoding"] == "cl100k_base"
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.ckpt"))


def test_python_dash_m_entry_point(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "gptlab.cli.train", "--cfg", "job"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["model"]["d_model"] == 128


def test_experiment_reference_is_the_reference_setting():
    cfg = composed("experiment=reference")
    assert cfg.data.batch_size == 4 and cfg.data.context_length == 16
    assert cfg.data.encoding == "cl100k_base" and cfg.data.compact_vocab is False
    m = cfg.model
    assert (m.d_model, m.num_heads, m.num_blocks, m.norm, m.dropout) == (64, 4, 8, "pre", 0.1)
    assert m.positional == "sinusoidal" and m.context_length == 16
    o = cfg.optim
    assert (o.lr, o.schedule, o.warmup_steps) == (1e-3, "constant", 0)
    assert cfg.trainer.max_steps == 5000 and cfg.trainer.val_check_interval == 50


@pytest.mark.parametrize(
    "group",
    [
        "model=tiny",
        "model=reference",
        "optim=constant",
        "trainer=cpu",
        "trainer=gpu",
        "trainer=ddp",
        "trainer=ddp_cpu",
        "callbacks=none",
        "logger=csv",
        "logger=many",
        "logger=none",
        "debug=overfit",
        "debug=profile",
        "data=text_file",
    ],
)
def test_every_group_option_composes(group):
    """The option is the one chosen, and every value its YAML file sets is in the composed
    config."""
    name, option = group.split("=")
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=[group], return_hydra_config=True)
    assert cfg.hydra.runtime.choices[name] == option
    values = option_values(name, option)
    for key, value in values.items():
        assert OmegaConf.select(cfg, key) == value, key
    if name != "callbacks":  # callbacks=none sets nothing: no callbacks at all
        assert values or name == "logger", f"{group} sets no value to check"
    else:
        assert cfg.callbacks == {}


def test_help_lists_resume_and_hides_the_schemas(tmp_path):
    out = check(run_main("--help", cwd=tmp_path)).stdout
    assert "resume: null" in out
    assert "schema" not in out


def test_logger_many_has_both():
    assert set(composed("logger=many").logger) == {"tensorboard", "csv"}


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.num_head=4", "num_head"),
        ("trainer.max_steps=abc", "max_steps"),
        ("data.batch_size=big", "batch_size"),
        ("optim.lrr=1", "lrr"),
        ("seed=abc", "seed"),
        ("model=schema", "no option 'schema'"),  # the schemas are not options
        ("model=model_schema", "no option 'model_schema'"),
        ("model=huge", "the model group has no option 'huge' (its options: default,"),
        ("trainer.precision=17", "precision"),
        ("num_threads=two", "num_threads"),
    ],
)
def test_bad_config_exits_2_with_a_paragraph_and_no_traceback(tmp_path, override, key):
    result = run_main(override, "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert key in result.stderr and "Traceback" not in result.stderr
    assert "+" + override not in result.stderr  # no hint to add a key the schema lacks
    assert not (tmp_path / "run").exists()  # refused before Hydra made a run directory


def test_a_misspelt_key_gets_a_did_you_mean(tmp_path):
    result = run_main("model.num_head=8", cwd=tmp_path)
    assert result.returncode == 2
    assert "model.num_head=8: the model node has no key 'num_head'; did you mean num_heads?" in (
        result.stderr
    )
    assert not (tmp_path / "outputs").exists()


def test_a_start_that_fails_leaves_no_directory_behind(tmp_path):
    """Refused once Hydra has made the run directory (a missing data.path): the stub is removed,
    and the folders above it that this start made."""
    result = run_main("data=text_file", "data.path=missing.txt", cwd=tmp_path)
    assert result.returncode == 2 and "data.path: no file at" in result.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())


def test_bad_model_config_fails_before_any_data_work(tmp_path):
    result = run_main(
        "model.d_model=64",
        "model.num_heads=3",
        "hydra.run.dir=run",
        cwd=tmp_path,
        env={"GPTLAB_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert result.returncode == 2
    assert "model.d_model=64" in result.stderr and "model.num_heads=3" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "cache").exists()  # nothing tokenized
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_debug_overfit_drives_the_train_loss_towards_zero(tmp_path):
    check(run_main("debug=overfit", "hydra.run.dir=run", cwd=tmp_path))
    train_loss = scalars(tmp_path / "run" / "tensorboard")["train/loss"]
    assert train_loss[0][1] > 5.0 and train_loss[-1][1] < 0.1  # the same 2 batches, memorised
