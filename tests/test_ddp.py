"""Every shipped trainer option, proven on CPU with only the accelerator switched; DDP with 2 gloo
processes, alone and under a Hydra sweep; compile."""

from __future__ import annotations

import functools
from pathlib import Path

import gptlab.conf
import lightning as L
import pytest
import torch
from helpers import check, read_metrics, run_cli
from hydra import compose, initialize_config_module

from gptlab.config.schemas import register_configs
from gptlab.data.tokenizer import Tokenizer
from gptlab.model.gpt import GPTConfig
from gptlab.run.checkpoints import load_model
from gptlab.training.module import GPTModule, OptimConfig

register_configs()  # the config schemas and resolvers that composing conf/train.yaml needs

FAST_TOKENS = 30 * 8 * 32  # debug=fast: steps x batch x context, per rank
CONF = Path(gptlab.conf.__file__).parent
# trainer=default is left out: on a CPU host it is trainer=cpu (accelerator auto), and every other
# test file trains with it
# every shipped trainer option but gpu, whose CPU-swapped run is test_gpu_check's (its `large`
# step: trainer=gpu with bf16-mixed, clipping and compile); default is the other tests' own
TRAINER_OPTIONS = sorted(
    p.stem for p in (CONF / "trainer").glob("*.yaml") if p.stem not in ("default", "gpu")
)


def files_under(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def on_cpu(option: str) -> list[str]:
    """`trainer=<option>` with only the accelerator switched to CPU (and every core for devices=-1):
    its precision, strategy, clipping and the rest stay as shipped."""
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        trainer = compose("train", overrides=[f"trainer={option}"]).trainer
    overrides = [f"trainer={option}", "trainer.accelerator=cpu"]
    return overrides + (["trainer.devices=2"] if trainer.devices == -1 else [])


@pytest.mark.parametrize("option", TRAINER_OPTIONS)
def test_every_trainer_option_trains_on_cpu(tmp_path, option):
    overrides = on_cpu(option)
    temp = tmp_path / "tmp"  # the processes' temporary folder: spawned DDP hands weights over there
    temp.mkdir()
    env = {"TMPDIR": str(temp)}
    result = check(run_cli(*overrides, "debug=fast", "hydra.run.dir=run", cwd=tmp_path, env=env))
    run_dir = tmp_path / "run"
    metrics = read_metrics(run_dir)
    world = 2 if "trainer.devices=2" in overrides or option == "ddp_cpu" else 1
    assert metrics["status"] == "ok" and metrics["device"] == f"cpu x{world}"
    assert metrics["tokens_seen"] == world * FAST_TOKENS  # every rank trained, on its own windows
    # and validates its own 4 batches of 8 x 32 (trainer.limit_val_batches is a rank's)
    assert f"a validation covers {world * 1024:,} of the 7,792 val tokens" in result.stderr
    files = files_under(run_dir)
    assert files.count("metrics.json") == 1
    assert [f for f in files if f.endswith(".ckpt")] == [
        "checkpoints/best.ckpt",
        "checkpoints/last.ckpt",
    ]
    assert result.stderr.count("Done: ") == 1  # rank 0 alone reports
    assert list(temp.iterdir()) == []  # nothing left behind, nor a warning about it
    assert "Not removing" not in result.stderr
    for noise in ("isinstance(treespec", "The `srun` command is available", "sync_dist=True"):
        assert noise not in result.stdout + result.stderr  # in spawned ranks too (gptlab.noise)
    assert "Done: " in (run_dir / "train.log").read_text()  # also from a spawned rank 0


def test_shipped_gpu_configs_keep_mixed_precision_and_clipping():
    """What the CPU runs above keep of the GPU configs: bf16 autocast with gradient clipping."""
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        for option in ("gpu", "ddp"):
            trainer = compose("train", overrides=[f"trainer={option}"]).trainer
            assert trainer.precision == "bf16-mixed" and trainer.gradient_clip_val == 1.0


def test_ddp_cpu_under_multirun_runs_each_job_once(tmp_path):
    """Each job also spends a FLOP budget: its steps count the tokens of both ranks."""
    budget = 4e9
    result = check(
        run_cli(
            "-m",
            "trainer=ddp_cpu",
            "debug=fast",
            "model.num_heads=2,4",
            f"flops_budget={budget}",
            "hydra.sweep.dir=sweep",
            cwd=tmp_path,
            timeout=600,
        )
    )
    sweep = tmp_path / "sweep"
    assert result.stdout.count("Launching 2 jobs") + result.stderr.count("Launching 2 jobs") == 1
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0", "1"]
    for job, heads in (("0", 2), ("1", 4)):
        job_dir = sweep / job
        assert f"model.num_heads={heads}" in (job_dir / ".hydra" / "overrides.yaml").read_text()
        m = read_metrics(job_dir)
        tokens_per_step = 2 * FAST_TOKENS // 30  # batch x context x 2 ranks
        assert m["steps"] == round(budget / (m["flops_per_token"] * tokens_per_step))
        assert m["tokens_seen"] == m["steps"] * tokens_per_step  # both ranks trained
        assert abs(m["train_flops"] / budget - 1) < 0.05 and m["flops_budget"] == budget
        assert (job_dir / "checkpoints" / "last.ckpt").is_file()
        assert (job_dir / "train.log").read_text().count("Done: ") == 1  # trained once


def test_compiled_model_checkpoint_loads_uncompiled_with_identical_logits(tmp_path, monkeypatch):
    """Trained through torch.compile's wrapper, saved with `model.` keys, loaded uncompiled. The
    graphs are compiled by the aot_eager backend (Dynamo and AOTAutograd, run eagerly): inductor's
    C++ build, half a minute of CPU with a cold cache, is test_gpu_check's (model.compile=true)."""
    torch.set_num_threads(1)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    tokenizer = Tokenizer("cl100k_base", list(range(50)))
    config = GPTConfig(
        vocab_size=50, context_length=8, d_model=16, num_heads=2, num_blocks=1, compile=True
    )
    module = GPTModule.fresh(GPTModule.hparams_from(config, OptimConfig(warmup_steps=0), tokenizer))
    x = torch.randint(50, (4, 8), generator=torch.Generator().manual_seed(0))
    batches = [(x, torch.roll(x, -1, dims=1))] * 2
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, torch.utils.data.DataLoader(batches, batch_size=None))
    trainer.save_checkpoint(tmp_path / "compiled.ckpt")

    state = torch.load(tmp_path / "compiled.ckpt", weights_only=True)["state_dict"]
    assert state and not [k for k in state if "_orig_mod" in k]
    loaded, _, _ = load_model(tmp_path / "compiled.ckpt")
    assert loaded.config.compile is False
    module.eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), module.model(x))
