"""model.parametrization=mup: the standard parametrisation at the base shape, each μP rule at
another width, and the coordinate check, which must fail for the standard parametrisation."""

import itertools
import json
import math
import re
import time

import pytest
import torch
from helpers import check, read_metrics, run_main
from hydra import compose, initialize_config_module
from test_resume import TINY, start, step_of, wait_for, weights

from gptlab.cli.coord_check import FLAT_SLOPE, coord_check, prompt_windows, slope
from gptlab.config.schemas import register_configs
from gptlab.errors import ConfigError
from gptlab.model.gpt import GPT, GPTConfig
from gptlab.training.module import GPTModule

register_configs()  # the config schemas and resolvers that composing conf/train.yaml needs
PROMPT = (
    "Building rapport is a fundamental skill in sales that cannot be underestimated. It lays the "
    "foundation for establishing a connection with your potential customers, gaining their trust, "
    "and ultimately convincing them to make a purchase. Rapport can be defined as a harmonious "
    "relationship based on mutual understanding and empathy."
)
SMALL = {"vocab_size": 50, "context_length": 16, "num_heads": 4, "num_blocks": 2, "dropout": 0.0}


def model(seed: int = 0, **settings) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**SMALL, **settings}))


def module(**settings) -> GPTModule:
    hparams = {"model": {**SMALL, **settings}, "optim": {"lr": 1e-3, "weight_decay": 0.1}}
    return GPTModule.fresh({**hparams, "tokenizer": {"encoding": "cl100k_base", "vocab": None}})


def test_at_the_base_shape_mup_is_the_standard_parametrisation():
    ids = torch.randint(0, 50, (2, 16))
    standard = model(d_model=64)
    mup = model(d_model=64, parametrization="mup", base_width=64, base_depth=2)
    assert torch.equal(standard(ids), mup(ids))
    groups = [module(d_model=64, **p).build_optimizer().param_groups for p in ({}, mup_at(64))]
    assert [(g["lr"], len(g["params"])) for g in groups[0]] == [
        (g["lr"], len(g["params"])) for g in groups[1]
    ]


def mup_at(base_width: int) -> dict:
    return {"parametrization": "mup", "base_width": base_width}


def test_mup_rules_four_times_wider_than_the_base():
    standard, mup = model(d_model=128), model(d_model=128, **mup_at(32))  # m = 4, same draws
    ratio = mup.blocks[0].ffn.up.weight / standard.blocks[0].ffn.up.weight
    assert torch.allclose(ratio, torch.full_like(ratio, 0.5))  # variance 1/fan_in: std / sqrt(m)
    assert torch.equal(mup.head.weight, standard.head.weight)  # readout: the multiplier instead
    assert mup.output_mult == 0.25 and standard.output_mult == 1.0
    assert mup.embed_mult == math.sqrt(32) and standard.embed_mult == math.sqrt(128)
    assert mup.blocks[0].attn.scale == pytest.approx(math.sqrt(32 / 4) / 32)  # ∝ 1/head_size
    assert standard.blocks[0].attn.scale is None  # sdpa's and the article's 1/sqrt(head_size)

    optimizer = module(d_model=128, **mup_at(32)).build_optimizer()
    by_name = {}
    for group in optimizer.param_groups:
        by_name.setdefault(group["name"], []).append((group["lr"], group["weight_decay"]))
    assert by_name == {"matrices": [(1e-3, 0.1)], "hidden": [(2.5e-4, 0.4)], "vectors": [(1e-3, 0)]}
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    assert sorted(scheduler.get_last_lr()) == [1.25e-4, 5e-4, 5e-4]  # each group's own lr, halved


@pytest.mark.parametrize("d_model", [32, 128])
def test_mutransfers_base_multipliers_hold_at_every_width(d_model):
    """model.mup_*: times the rules' own output, embedding and attention multipliers and every
    initial draw, the same at the base (32) and 4x wider: what is tuned there carries over."""
    mults = {"mup_output": 2.0, "mup_embedding": 3.0, "mup_init": 0.5, "mup_attention": 0.25}
    plain, tuned = (
        model(d_model=d_model, **mup_at(32)),
        model(d_model=d_model, **mup_at(32), **mults),
    )
    assert tuned.output_mult == pytest.approx(2.0 * plain.output_mult)
    assert tuned.embed_mult == pytest.approx(3.0 * plain.embed_mult)
    assert tuned.blocks[0].attn.scale == pytest.approx(0.25 * plain.blocks[0].attn.scale)
    for name in ("token_embedding.weight", "head.weight", "blocks.1.ffn.down.weight"):
        ratio = tuned.get_parameter(name) / plain.get_parameter(name)
        assert torch.allclose(ratio, torch.full_like(ratio, 0.5)), name


@pytest.mark.parametrize(
    "toggles",
    [{}, {"positional": "rope", "qk_norm": True, "activation": "swiglu", "tie_weights": True}],
)
def test_both_attention_paths_agree_under_mup(toggles):
    """sdpa gets μP's scale through `scale=`, manual multiplies by it: the same logits."""
    ids = torch.randint(0, 50, (2, 16))
    settings = {"d_model": 128, **mup_at(32), "base_depth": 1, **toggles}
    sdpa, manual = model(**settings), model(**settings, attention="manual")
    manual.load_state_dict(sdpa.state_dict())
    assert torch.allclose(sdpa(ids), manual(ids), atol=1e-5)


@pytest.mark.parametrize(("adjust", "muon_lr"), [("original", 0.02), ("match_rms_adamw", 0.01)])
def test_muon_under_mup_keeps_its_spectral_step(adjust, muon_lr):
    optim = {"lr": 1e-3, "name": "muon", "muon_lr": 0.02, "muon_adjust_lr": adjust}
    hparams = {"model": {**SMALL, "d_model": 128, **mup_at(32)}, "optim": optim}
    tokenizer = {"encoding": "cl100k_base", "vocab": None}
    optimizer = GPTModule.fresh({**hparams, "tokenizer": tokenizer}).build_optimizer()
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(muon_lr)
    assert {g["name"] for g in optimizer.adamw.param_groups} == {"matrices", "vectors"}


def test_depth_rule_scales_the_residual_branches():
    standard = model(d_model=32, num_blocks=8)
    deep = model(d_model=32, num_blocks=8, **mup_at(32), base_depth=2)
    assert deep.blocks[0].branch == 0.25 and standard.blocks[0].branch == 1.0
    ratio = deep.blocks[3].attn.proj.weight / standard.blocks[3].attn.proj.weight
    assert torch.allclose(ratio, torch.full_like(ratio, 2.0))  # GPT-2's 1/sqrt(2L) at L = 2


@pytest.mark.parametrize(
    "settings",
    [{"parametrization": "mu"}, {"base_width": 0}, {"base_depth": 0}, {"base_width": 64.0}]
    + [{"mup_output": 0.0}, {"mup_init": -1.0}],
)
def test_bad_mup_settings_are_refused(settings):
    with pytest.raises(ConfigError, match=f"model.{next(iter(settings))}"):
        GPTConfig(**settings)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("model.parametrization=mu", "choose one of ('standard', 'mup')"),
        ("model.base_width=0", "model.base_width=0: it must be a positive integer"),
    ],
)
def test_bad_mup_key_exits_2_before_any_data_work(tmp_path, override, needle):
    env = {"GPTLAB_CACHE_DIR": str(tmp_path / "cache")}
    result = run_main("debug=fast", override, "hydra.run.dir=run", cwd=tmp_path, env=env)
    assert result.returncode == 2 and needle in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "cache").exists()


def test_coord_check_flat_under_mup_growing_under_standard():
    """Logits, attention logits and attention outputs after 5 steps at widths 32 to 256: under
    μP no layer grows with width; the same check fails for the standard parametrisation."""
    tokenizer, ids = prompt_windows(PROMPT, "cl100k_base", 16, 4)
    settings = {**SMALL, "base_width": 32}
    settings.pop("vocab_size")
    results = coord_check(settings, tokenizer, ids, [32, 64, 128, 256], 5, 0.01, [0, 1])
    layers = ["logits", "block 0 attention logits", "block 1 attention logits"]
    layers += ["block 0 attention", "block 1 attention", "block 1 output"]

    def assert_flat(by_width):
        for layer in layers:
            assert slope(by_width, layer) < FLAT_SLOPE, layer

    assert_flat(results["mup"])
    with pytest.raises(AssertionError):
        assert_flat(results["standard"])
    assert all(slope(results["standard"], layer) > FLAT_SLOPE for layer in layers)


def test_mup_trains_from_the_command_line(tmp_path):
    args = ["model.parametrization=mup", "model.base_width=64", "model.d_model=256", "debug=fast"]
    done = run_main(*args, "hydra.run.dir=run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert math.isfinite(metrics["best_val_loss"]) and metrics["best_val_loss"] < 7.0


def test_mup_resumes_exactly_after_kill_9(tmp_path):
    """μP's own learning-rate groups come back from last.ckpt: kill -9 at step 20 or later,
    resume=, and end with the uninterrupted run's weights and val loss."""
    mup = [*TINY, "trainer.max_steps=40", "model.parametrization=mup", "model.base_width=16"]
    check(run_main(*mup, "hydra.run.dir=whole", cwd=tmp_path))
    run_dir = tmp_path / "killed"
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = start(*mup, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    wait_for(last, proc)
    while step_of(last) < 20:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.kill()
    proc.communicate()
    assert 20 <= step_of(last) < 40 and not (run_dir / "metrics.json").exists()
    check(run_main(f"resume={run_dir}", cwd=tmp_path))
    whole, resumed = weights(tmp_path / "whole/checkpoints/last.ckpt"), weights(last)
    assert max((whole[k] - resumed[k]).abs().max().item() for k in whole) <= 1e-6
    assert (
        read_metrics(run_dir)["best_val_loss"] == read_metrics(tmp_path / "whole")["best_val_loss"]
    )


@pytest.mark.parametrize(
    ("experiment", "size"), [("mup_transfer", "model.d_model"), ("mup_depth", "model.num_blocks")]
)
def test_transfer_experiments_hold_their_grids(experiment, size):
    """optim.lr x a size spanning 8x (4 values or more) x 5 rates x 2 seeds x both
    parametrisations: 80 jobs, each a model μP accepts."""
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        cfg = compose("train", [f"experiment={experiment}"], return_hydra_config=True)
    params = {key: str(value).split(",") for key, value in cfg.hydra.sweeper.params.items()}
    sizes = [int(value) for value in params[size]]
    assert len(sizes) >= 4 and max(sizes) == 8 * min(sizes)
    assert len(params["optim.lr"]) == 5 and len(params["seed"]) == 2
    assert params["model.parametrization"] == ["standard", "mup"]
    assert len(list(itertools.product(*params.values()))) == 80
    for values in itertools.product(*params.values()):
        job = dict(zip(params, values, strict=True))
        model = {**cfg.model, "vocab_size": 100, "context_length": 64}
        model.pop("_target_")
        model.update({k.split(".")[1]: v for k, v in job.items() if k.startswith("model.")})
        GPTConfig(**{k: int(v) if k in ("d_model", "num_blocks") else v for k, v in model.items()})


def test_mutransfer_workflow_writes_its_verdict_with_intervals(tmp_path):
    """experiment=mutransfer end to end at a tiny size through the real command: 2 Optuna trials
    at d_model 8 (the rate and the four base multipliers), the best carried to d_model 16 over 2
    seeds, and d_model 16 tuned directly under standard on 2 rates x 2 seeds; summary.md's verdict
    gives both wide models' val loss with 95% intervals and each side's tuning FLOPs."""
    after = (
        "[{best:true,model.parametrization:mup,model.d_model:16,seed:'1,2'},"
        "{model.parametrization:standard,model.d_model:16,optim.lr:'1e-3,1e-2',seed:'1,2'}]"
    )
    tiny = ["trainer.max_steps=4", "trainer.val_check_interval=2", "optim.warmup_steps=1"]
    tiny += ["model.d_model=8", "model.base_width=8", "logger=none", "data.batch_size=4"]
    search = ["hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.n_startup_trials=1"]
    args = ["-m", "experiment=mutransfer", *tiny, *search, f"hydra.sweeper.after={after}"]
    check(run_main(*args, "hydra.sweep.dir=sweep", cwd=tmp_path))
    sweep = tmp_path / "sweep"
    trials = [read_metrics(sweep / str(job)) for job in range(2)]
    wide = [read_metrics(sweep / str(job)) for job in range(2, 8)]
    assert all(m["num_params"] < wide[0]["num_params"] for m in trials)
    transferred = {o for o in wide[0]["overrides"] if o.split("=")[0].startswith("model.mup_")}
    assert len(transferred) == 4 and transferred <= set(wide[1]["overrides"])  # the best trial's
    text = (sweep / "summary.md").read_text()
    section = text.split("## μTransfer against direct tuning")[1].split("\n## ")[0]
    mup_row, direct_row = [
        line
        for line in section.splitlines()
        if line.startswith("| μT") or line.startswith("| direct")
    ]
    for row, jobs in ((mup_row, trials), (direct_row, wide[2:])):
        flops = sum(m["train_flops"] for m in jobs)
        assert f"| {flops:.3g} | 2 |" in row, row  # its tuning FLOPs, its 2 seeds
        assert re.search(r"\| \d\.\d{4} ± \d\.\d{4} \|$", row), row  # mean ± the 95% half-width
    assert (
        "2 trials at d_model 8: optim.lr=" in mup_row and "optim.lr 0.001, 0.01: best" in direct_row
    )
    # two rates: the standard optimum is at an edge of its grid, so no verdict can say it pays
    assert "(at the edge: the optimum may lie beyond)" in direct_row
    said = r"- Verdict: μTransfer does not pay \(.*the standard optimum at its edge\): its wide "
    assert re.search(said + r"model's val loss is [+-]\d\.\d{4} ± \d\.\d{4} against", section)
    share = sum(m["train_flops"] for m in trials) / sum(m["train_flops"] for m in wide[2:])
    assert f"for {share:.1%} of the standard side's tuning FLOPs" in section
