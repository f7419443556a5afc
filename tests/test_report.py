"""The hyperparameters the trackers compare runs by (gptlab.training.trackers), the config tree of
the first screen (gptlab.run.screen), and metrics.json and the final report after a real (tiny)
Trainer fit on CPU (gptlab.training.report)."""

import io
import json
import math

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from rich.console import Console
from torch.utils.data import DataLoader, TensorDataset

from gptlab.config.schemas import register_configs
from gptlab.data.tokenizer import Tokenizer
from gptlab.model.gpt import GPT, GPTConfig
from gptlab.run.place import PLACE
from gptlab.run.screen import GROUPS, config_tree, model_line
from gptlab.training.module import GPTModule, OptimConfig
from gptlab.training.report import RunReport
from gptlab.training.run_stats import RunStats
from gptlab.training.trackers import (
    Results,
    RunTensorBoardLogger,
    hparams_of,
    publish,
    publish_tensorboard,
    publisher,
)

register_configs()  # what composing conf/train.yaml needs
torch.set_num_threads(1)  # tiny tensors: one thread is fastest and robust to a busy machine

CONTEXT = 16
BATCH = 4
STEPS = 6
TEXT = (
    "Building rapport is a fundamental skill in sales that cannot be underestimated. It lays "
    "the foundation for establishing a connection with your potential customers, gaining their "
    "trust, and ultimately convincing them to make a purchase. Rapport can be defined as a "
    "harmonious relationship based on mutual understanding and empathy. When you build rapport "
    "with someone, you create a sense of familiarity, comfort, and shared interests, making it "
    "easier to communicate and influence their decision-making process."
)


def composed(tmp_path, *overrides: str):
    """conf/train.yaml as Hydra composes it, its paths set to plain folders (outside a Hydra run
    the `hydra:` resolver has nothing to read)."""
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    cfg.paths = {
        "root_dir": str(tmp_path),
        "data_dir": str(tmp_path / "data"),
        "cache_dir": str(tmp_path / "cache"),
        "output_dir": str(tmp_path / "run"),
    }
    return cfg


# ---------------------------------------------------------------------------------------------
# hparams_of


def test_hparams_are_flat_plain_and_without_targets(tmp_path):
    cfg = composed(tmp_path, "debug=fast")
    model = {"d_model": 32, "num_heads": 2, "bias": True, "vocab_size": None, "sizes": [1, 2]}
    params = hparams_of(cfg, {"num_params": 1234, "best_val_loss": 5.0}, model)

    optim_keys = [k for k in cfg.optim if k != "_target_"]
    assert set(params) == {
        *(f"model/{k}" for k in model),
        *(f"optim/{k}" for k in optim_keys),
        "data/encoding",
        "data/compact_vocab",
        "data/batch_size",
        "data/context_length",
        "trainer/max_steps",
        "seed",
        "num_params",
    }
    assert params["model/d_model"] == 32 and params["model/bias"] is True
    assert params["model/vocab_size"] == "None"  # TensorBoard's hparams take no None
    assert params["model/sizes"] == "[1, 2]"  # nor lists
    assert params["optim/lr"] == cfg.optim.lr
    assert params["optim/betas"] == str(list(cfg.optim.betas))
    assert params["optim/warmup_steps"] == 5  # debug=fast
    assert params["data/batch_size"] == 8 and params["data/context_length"] == 32
    assert params["data/encoding"] == "cl100k_base"
    assert params["trainer/max_steps"] == 30
    assert params["seed"] == 1337 and params["num_params"] == 1234
    assert all(isinstance(v, (bool, int, float, str)) for v in params.values())


def test_hparams_put_the_swept_keys_first_then_the_model_size(tmp_path):
    cfg = composed(tmp_path, "debug=fast", "model.num_heads=2")
    model = {"d_model": 32, "num_heads": 2}
    swept = ["model.num_heads=2", "+ablation=rope", "trainer.max_steps=30"]
    params = hparams_of(cfg, {"num_params": 99}, model, swept)
    assert list(params)[:4] == ["model/num_heads", "ablation", "trainer/max_steps", "num_params"]
    assert params["model/num_heads"] == 2 and params["ablation"] == "rope"  # a group's option
    assert params["trainer/max_steps"] == 30
    assert list(hparams_of(cfg, {"num_params": 99}, model))[0] == "num_params"  # nothing swept


# ---------------------------------------------------------------------------------------------
# config_tree


def test_a_logger_without_a_publisher_of_its_own_gets_lightnings_interface(tmp_path):
    """CSV (no publisher of its own): the hyperparameters and the val results through Lightning's
    log_hyperparams and log_metrics, in its own files; a subclass takes its base's publisher."""
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(str(tmp_path), name="csv", version="")
    assert publisher(logger) is publish
    params = {"model/d_model": 32, "optim/lr": 0.003}
    results = Results(params, {}, {}, {"val_results/best_loss": 4.5}, [], 7, tmp_path)
    publisher(logger)(logger, results)
    logger.save()
    assert yaml.safe_load((tmp_path / "csv" / "hparams.yaml").read_text()) == params
    written = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()
    assert written[0].split(",") == ["step", "val_results/best_loss"] and written[1] == "7,4.5"

    class Own(RunTensorBoardLogger):
        pass

    assert publisher(Own(str(tmp_path), name="tb", version="")) is publish_tensorboard


def test_config_tree_has_a_branch_per_group_then_the_top_level(tmp_path):
    cfg = composed(tmp_path, "model=tiny", "seed=7")
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))  # as gptlab-train
    tree = config_tree(resolved)
    expected = [g for g in GROUPS if g in cfg] + ["(top level)"]
    assert [str(branch.label) for branch in tree.children] == [
        f"[bold]{name}[/bold]" for name in expected
    ]
    branches = {
        name: yaml.safe_load(str(branch.children[0].label))
        for name, branch in zip(expected, tree.children, strict=True)
    }
    model = branches["model"]
    assert model["d_model"] == 64 and model["num_heads"] == 4  # model=tiny
    assert model["context_length"] == cfg.data.context_length
    assert "vocab_size" not in model  # null until the data sets it: hidden
    top = branches["(top level)"]
    assert top["seed"] == 7 and top["sample_prompt"] == "The salesperson"
    assert "ckpt_path" not in top and "resume" not in top  # unset
    assert not set(top) & set(GROUPS)
    assert branches["paths"]["output_dir"] == str(tmp_path / "run")

    out = io.StringIO()
    Console(file=out, width=110, color_system=None).print(tree)
    assert "d_model: 64" in out.getvalue() and "ckpt_path" not in out.getvalue()


def test_the_first_screen_reads_as_written_counts_separated_and_says_mup(tmp_path):
    """flops_budget=4e10 as 4e+10 (its value unchanged), counts with separators, a plural only
    for more than one, and a line that says μP is on, with its base width."""
    cfg = composed(tmp_path, "flops_budget=4e10")
    tree = config_tree(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)))
    top = str(tree.children[-1].children[0].label)
    assert "flops_budget: 4e+10" in top.splitlines() and "40000000000" not in top
    assert yaml.safe_load(top)["flops_budget"] == "4e+10"  # shown as written, read as 4e10
    shape = {"vocab_size": 3771, "context_length": 32, "d_model": 32, "num_heads": 1}
    one = GPT(GPTConfig(**shape, num_blocks=1))
    line = model_line(one)
    total = one.num_params()["total"]
    assert line == (
        f"GPT: {total:,} parameters (d_model 32, 1 head, 1 block, context 32, vocab 3,771)"
    )
    assert total > 1000 and "μP" not in line
    mup = model_line(GPT(GPTConfig(**shape, num_blocks=2, parametrization="mup", base_width=16)))
    assert "2 blocks" in mup and mup.splitlines()[1].startswith("μP on: base width 16 ")


# ---------------------------------------------------------------------------------------------
# metrics.json and the report after a real fit


def windows(ids: np.ndarray) -> TensorDataset:
    starts = range(0, len(ids) - CONTEXT, CONTEXT)
    x = torch.tensor(np.stack([ids[s : s + CONTEXT] for s in starts]))
    y = torch.tensor(np.stack([ids[s + 1 : s + CONTEXT + 1] for s in starts]))
    return TensorDataset(x, y)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A tiny GPT fitted for STEPS steps with RunStats and RunReport, as gptlab-train adds them."""
    out = tmp_path_factory.mktemp("run")
    PLACE.admit(out, "the test's run directory")  # as gptlab-train's callback admits it
    tiktoken_ids = Tokenizer("cl100k_base").encode_tiktoken(TEXT)
    tokenizer = Tokenizer.fit("cl100k_base", tiktoken_ids, compact=True)
    data = windows(np.asarray(tokenizer.encode(TEXT), dtype=np.int64))
    config = GPTConfig(
        vocab_size=tokenizer.vocab_size,
        context_length=CONTEXT,
        d_model=32,
        num_heads=2,
        num_blocks=1,
        dropout=0.0,
    )
    torch.manual_seed(0)
    module = GPTModule.fresh(GPTModule.hparams_from(config, OptimConfig(warmup_steps=2), tokenizer))
    cfg = {
        "sample_prompt": "Building rapport",
        "seed": 0,
        "optim": {"lr": 1e-3},
        "data": {
            "encoding": "cl100k_base",
            "compact_vocab": True,
            "batch_size": BATCH,
            "context_length": CONTEXT,
        },
        "trainer": {"max_steps": STEPS},
    }
    stats = RunStats(
        tokens_per_step=BATCH * CONTEXT, flops_per_token=module.model.flops_per_token()
    )
    report = RunReport(cfg, out, stats, overrides=["seed=0"], swept=["seed=0"])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[stats, report],
        default_root_dir=out,
    )
    generator = torch.Generator().manual_seed(0)
    train = DataLoader(data, batch_size=BATCH, shuffle=True, drop_last=True, generator=generator)
    val = DataLoader(data, batch_size=BATCH)
    trainer.fit(module, train_dataloaders=train, val_dataloaders=val)
    return out, trainer, module, val


def test_metrics_json_holds_the_runs_real_results(fitted):
    out, _, module, val = fitted
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "ok" and metrics["overrides"] == ["seed=0"]
    assert metrics["steps"] == STEPS
    assert metrics["tokens_seen"] == STEPS * BATCH * CONTEXT
    assert metrics["num_params"] == sum(p.numel() for p in module.model.parameters())
    assert metrics["device"] == "cpu x1"

    # the final val loss is the exact mean over every val token: recomputed here
    with torch.no_grad():
        losses = [
            F.cross_entropy(module(x).flatten(0, 1), y.flatten(), reduction="sum") for x, y in val
        ]
    tokens = sum(y.numel() for _, y in val)
    assert metrics["final_val_loss"] == pytest.approx(float(sum(losses)) / tokens, rel=1e-5)
    assert metrics["best_val_loss"] == module.best_val_loss <= metrics["final_val_loss"]
    assert metrics["best_val_perplexity"] == pytest.approx(math.exp(metrics["best_val_loss"]))
    ratio = metrics["final_val_bpb"] / metrics["final_val_loss"]
    assert metrics["best_val_bpb"] == pytest.approx(metrics["best_val_loss"] * ratio)
    # training time (tokens / rate) is part of the wall time
    assert 0 < metrics["tokens_seen"] / metrics["tokens_per_sec"] <= metrics["wall_seconds"] * 1.01


def test_metrics_name_the_slurm_job(fitted, monkeypatch):
    _, trainer, module, _ = fitted
    report = next(c for c in trainer.callbacks if isinstance(c, RunReport))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert report.metrics(trainer, module)["slurm_job_id"] is None
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert report.metrics(trainer, module)["slurm_job_id"] == "4242"


def test_the_report_states_the_results_and_a_sample(fitted):
    out, trainer, module, _ = fitted
    report = next(c for c in trainer.callbacks if isinstance(c, RunReport))
    metrics = json.loads((out / "metrics.json").read_text())
    lines = report.report(trainer, metrics)
    assert lines[0].startswith(f"Done: {STEPS} steps, {STEPS * BATCH * CONTEXT:,} tokens in ")
    assert f"Best val loss {metrics['best_val_loss']:.4f}" in lines[1]
    assert f"final {metrics['final_val_loss']:.4f}." in lines[1]
    assert lines[2] == f"Run directory: {out}"
    assert report.sample(module).startswith("Sample: 'Building rapport")
    assert not any(line.startswith("TensorBoard") for line in lines)  # no logger in this fit
