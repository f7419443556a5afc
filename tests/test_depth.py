"""One knob (docs/training.md): model.depth=N derives the width, heads, blocks, token budget,
batch, learning rate, its floor and warmup, and the weight decay by the documented rules; a key
given anywhere wins and the first screen says so; a bad depth, ratio or budget is one paragraph
and exit code 2 before torch loads; without a depth nothing changes."""

import math

import pytest
from helpers import check, read_metrics, run_cli, run_main, train_without_torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from gptlab.config import depth
from gptlab.config.knob import Knob, provenance
from gptlab.config.schemas import register_configs
from gptlab.model.config import GPTConfig

register_configs()


def composed(*overrides: str):
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        return compose("train", overrides=list(overrides))


def documented(depth_: int, ratio: float = 20.0, context: int = 64) -> dict:
    """docs/training.md's rules, written out again from the table (not from gptlab's code)."""
    d_model = 32 * math.ceil(32 * depth_ / 32)
    n = depth_ * 12 * d_model**2  # Wq, Wk, Wv, Wo and the FFN's two (4 x d_model wide)
    n_ref = 4 * 12 * 128**2
    d, d_ref = ratio * n, ratio * n_ref
    b = 2 ** round(math.log2(16 * 64 * (d / d_ref) ** 0.383))
    lr = 3e-3 * math.sqrt(b / 1024) * (d_model / 128) ** -0.5
    steps = round(d / b)
    return {
        "model.num_blocks": depth_,
        "model.d_model": d_model,
        "model.num_heads": d_model // 32,
        "data.batch_size": b // context,
        "trainer.max_steps": steps,
        "optim.lr": lr,
        "optim.min_lr": 0.1 * lr,
        "optim.weight_decay": 0.1 * (b / 1024) * (3e-3 / lr) * (d_ref / d),
        "optim.warmup_steps": round(steps / 12),
    }


@pytest.mark.parametrize("n", [1, 3, 6])
def test_each_derived_value_is_the_documented_rule(n):
    cfg = composed(f"model.depth={n}")
    for key, expected in documented(n).items():
        assert OmegaConf.select(cfg, key) == pytest.approx(expected, rel=1e-12), key
    assert depth.Rung(cfg).n == n * 12 * cfg.model.d_model**2


def test_the_block_count_is_the_models_own():
    """N of the rules is the blocks' matrices as the built GPT counts them (SwiGLU too)."""
    import torch

    from gptlab.model.config import block_params
    from gptlab.model.gpt import GPT

    for activation in ("relu", "swiglu"):
        config = GPTConfig(
            vocab_size=50, d_model=96, num_heads=3, num_blocks=2, activation=activation
        )
        with torch.device("meta"):
            model = GPT(config)
        counted = sum(p.numel() for p in model.block_matrices())
        assert block_params(96, 2, 4, activation) == counted


def test_without_a_depth_every_default_stands():
    cfg = composed()
    assert cfg.model.depth is None
    expected = {
        "model.num_blocks": 4,
        "model.d_model": 128,
        "model.num_heads": 4,
        "data.batch_size": 16,
        "trainer.max_steps": 1200,
        "optim.lr": 3e-3,
        "optim.min_lr": 3e-4,
        "optim.weight_decay": 0.1,
        "optim.warmup_steps": 100,
    }
    assert {key: OmegaConf.select(cfg, key) for key in expected} == expected
    assert provenance(cfg) == Knob() and Knob().screen_lines() == []
    # the reference rung is the default model with its default training
    rung4 = composed("model.depth=4", "tokens_per_param=4")
    reference = {**expected, "trainer.max_steps": 3072, "optim.warmup_steps": 256}
    for key, value in reference.items():
        assert OmegaConf.select(rung4, key) == pytest.approx(value, rel=1e-12), key


def test_a_value_given_anywhere_wins_and_the_rules_follow_it():
    """A given d_model (the command line) and a debug preset's keys win; the rules downstream
    read the values the run has: the heads of the given width, the lr of the given batch."""
    cfg = composed("model.depth=2", "model.d_model=96", "data.batch_size=32")
    knob = provenance(cfg)
    rows = {key: (value, derived, rule) for key, value, derived, rule in knob.rows}
    assert rows["model.d_model"] == (96, False, 64)
    assert rows["data.batch_size"][:2] == (32, False)
    assert rows["model.num_heads"] == (3, True, 3)
    assert rows["optim.lr"][0] == pytest.approx(
        3e-3 * math.sqrt(32 * 64 / 1024) * (96 / 128) ** -0.5
    )
    lines = knob.screen_lines()
    assert lines[0].startswith(
        "One knob: model.depth derived model.num_blocks=2, model.num_heads=3"
    )
    assert "  model.d_model=96 given: it wins over the rule's 64" in lines
    preset = composed("model.depth=3", "debug=fast")
    assert preset.model.d_model == 32 and preset.trainer.max_steps == 30  # debug=fast's own
    # the rules of its model (model=tiny's one block, debug's width 32) and batch (8 x 32 tokens)
    assert preset.model.num_blocks == 1 and preset.optim.weight_decay == pytest.approx(
        0.1 * (256 / 1024) * (3e-3 / preset.optim.lr) * (4 * 12 * 128**2) / (12 * 32**2)
    )


def test_cfg_job_shows_the_derived_values(tmp_path):
    result = check(run_cli("model.depth=3", "--cfg", "job", cwd=tmp_path))
    job = OmegaConf.create(result.stdout)
    assert job.model.d_model == 96 and job.trainer.max_steps == documented(3)["trainer.max_steps"]
    assert "${gptlab.depth" not in result.stdout
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("model.depth=0", "model.depth=0: the depth is a number of blocks"),
        ("tokens_per_param=-1", "tokens_per_param=-1"),
        ("tokens_per_param=0.001", "buys no optimizer step of 256 tokens"),
    ],
)
def test_a_bad_depth_ratio_or_budget_exits_2_before_torch(tmp_path, override, said):
    out = train_without_torch("model.depth=1", override, cwd=tmp_path)
    assert out.stdout == "2\n[]\n", out.stderr
    message = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(message) == 1 and said in message[0], out.stderr
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_depth_trains_with_its_derived_settings(tmp_path):
    """A real run of rung 1 (48 steps at a ratio of 1): the first screen says what was derived
    and what was given, and metrics.json keeps both, as a ladder's report reads them."""
    result = check(
        run_main(
            "model.depth=1",
            "tokens_per_param=1",
            "optim.lr=2e-3",
            "hydra.run.dir=run",
            cwd=tmp_path,
        )
    )
    log = (tmp_path / "run" / "train.log").read_text()
    assert "One knob: model.depth derived model.num_blocks=1, model.d_model=32" in log
    assert "optim.lr=0.002 given: it wins over the rule's 0.003" in log
    metrics = read_metrics(tmp_path / "run")
    expected = documented(1, ratio=1)
    assert metrics["steps"] == expected["trainer.max_steps"] == 48
    assert metrics["depth"] == 1 and metrics["settings"]["d_model"] == 32
    rules = metrics["depth_rules"]
    assert rules["optim.lr"] == {"value": 2e-3, "rule": pytest.approx(3e-3), "derived": False}
    assert rules["optim.min_lr"]["value"] == pytest.approx(2e-4)  # of the given lr
    assert rules["data.batch_size"] == {"value": 4, "rule": 4, "derived": True}
    assert result.returncode == 0


def test_a_batch_derived_for_other_processes_is_refused_before_training():
    """The rules split the batch over trainer.devices' processes; Lightning counting another
    number (devices=auto on a GPU machine) would change it: the length's check says which."""
    from gptlab.errors import ConfigError
    from gptlab.training.budget import run_length
    from gptlab.training.optim_config import OptimConfig

    cfg = composed("model.depth=1", "trainer.accelerator=cpu")
    knob = provenance(cfg)
    assert knob.ranks == 1 and run_length(cfg, 1000, OptimConfig(), derived_for=1).ranks == 1
    with pytest.raises(ConfigError, match="split the batch over 2 process.*trainer.devices=1"):
        run_length(cfg, 1000, OptimConfig(), derived_for=2)
