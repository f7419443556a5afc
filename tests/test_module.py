"""The LightningModule on a real CPU Trainer: memorising a short text, the optimiser's parameter
groups and schedule, checkpoints that rebuild themselves, and the optimiser config's errors."""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import replace

import lightning as L
import numpy as np
import pytest
import torch
from helpers import scalars
from lightning.fabric.utilities.warnings import PossibleUserWarning
from torch.utils.data import DataLoader, TensorDataset

from gptlab.data.tokenizer import Tokenizer
from gptlab.errors import ConfigError
from gptlab.model.gpt import GPT, GPTConfig
from gptlab.run.checkpoints import load_model
from gptlab.training.callbacks import LastCheckpoint
from gptlab.training.module import GPTModule, OptimConfig, lr_factor
from gptlab.training.optim_config import (
    branch_length,
    branch_steps,
    check_schedule,
    cooldown_start,
)
from gptlab.training.trackers import RunTensorBoardLogger, StepLoggedBeforeSave

os.environ.setdefault("TIKTOKEN_CACHE_DIR", "/work/shared/tiktoken_cache")
torch.set_num_threads(1)  # small tensors: one thread is fastest, and robust to a busy machine
pytestmark = pytest.mark.filterwarnings(
    "ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"
)

CONTEXT = 16

TEXT = (
    "Building rapport is a fundamental skill in sales that cannot be underestimated. It lays "
    "the foundation for establishing a connection with your potential customers, gaining their "
    "trust, and ultimately convincing them to make a purchase. Rapport can be defined as a "
    "harmonious relationship based on mutual understanding and empathy. When you build rapport "
    "with someone, you create a sense of familiarity, comfort, and shared interests, making it "
    "easier to communicate and influence their decision-making process. One of the main reasons "
    "why building rapport is crucial in sales is that people are more likely to buy from someone "
    "they like and trust. By establishing a positive and genuine connection with your customers, "
    "you increase their confidence in you and your product or service. People want to do "
    "business with individuals they feel comfortable with, those who understand their needs and "
    "genuinely care about their success. When you show a sincere interest in your customers, "
    "they are more likely to reciprocate that interest, leading to a stronger rapport. "
    "Additionally, building rapport helps to create an open and conducive environment for "
    "effective communication."
)


# ------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def corpus() -> tuple[Tokenizer, np.ndarray]:
    """A compact tokenizer fitted on TEXT and TEXT's model ids (about 200 tokens)."""
    tiktoken_ids = Tokenizer("cl100k_base").encode_tiktoken(TEXT)
    tokenizer = Tokenizer.fit("cl100k_base", tiktoken_ids, compact=True)
    ids = np.asarray(tokenizer.encode(TEXT), dtype=np.int64)
    assert 190 <= len(ids) <= 260
    return tokenizer, ids


def windows(ids: np.ndarray, stride: int = CONTEXT) -> TensorDataset:
    """Input/target windows of CONTEXT tokens, the target shifted by one."""
    starts = range(0, len(ids) - CONTEXT, stride)
    x = torch.tensor(np.stack([ids[s : s + CONTEXT] for s in starts]))
    y = torch.tensor(np.stack([ids[s + 1 : s + CONTEXT + 1] for s in starts]))
    return TensorDataset(x, y)


def make_module(
    tokenizer: Tokenizer, seed: int = 0, model: dict | None = None, optim: dict | None = None
) -> GPTModule:
    model_kwargs = dict(
        vocab_size=tokenizer.vocab_size,
        context_length=CONTEXT,
        d_model=64,
        num_heads=4,
        num_blocks=2,
        dropout=0.0,
    )
    model_kwargs.update(model or {})
    optim_kwargs = dict(lr=1e-3, warmup_steps=2, min_lr=1e-4)
    optim_kwargs.update(optim or {})
    torch.manual_seed(seed)
    hparams = GPTModule.hparams_from(
        GPTConfig(**model_kwargs), OptimConfig(**optim_kwargs), tokenizer
    )
    return GPTModule.fresh(hparams)


def make_trainer(tmp_path, max_steps: int, **kwargs) -> L.Trainer:
    kwargs.setdefault("enable_checkpointing", False)
    kwargs.setdefault("logger", False)
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=max_steps,
        default_root_dir=tmp_path,
        **kwargs,
    )


def fit(
    module: GPTModule,
    dataset: TensorDataset,
    tmp_path,
    max_steps: int,
    batch_size: int = 64,
    **kwargs,
) -> L.Trainer:
    trainer = make_trainer(tmp_path, max_steps, **kwargs)
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PossibleUserWarning)
        trainer.fit(module, train_dataloaders=loader)
    return trainer


@torch.no_grad()
def mean_loss(module: GPTModule, dataset: TensorDataset) -> float:
    module.eval()
    x, y = dataset.tensors
    return float(module.loss((x, y)))


# ------------------------------------------------------------------ training
MEMORISE_STEPS = 60


@pytest.fixture(scope="module")
def memorised(corpus, tmp_path_factory):
    """Full-batch training on the text's non-overlapping windows until it is memorised."""
    tokenizer, ids = corpus
    dataset = windows(ids)
    module = make_module(
        tokenizer,
        model={"positional": "learned"},
        optim={"lr": 1e-2, "warmup_steps": 10, "min_lr": 1e-3, "weight_decay": 0.0},
    )
    loss_before = mean_loss(module, dataset)
    module.train()
    # the same full batch MEMORISE_STEPS times in one epoch: no per-epoch overhead
    x, y = dataset.tensors
    repeated = TensorDataset(x.repeat(MEMORISE_STEPS, 1), y.repeat(MEMORISE_STEPS, 1))
    trainer = make_trainer(tmp_path_factory.mktemp("memorise"), MEMORISE_STEPS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PossibleUserWarning)
        trainer.fit(module, train_dataloaders=DataLoader(repeated, batch_size=len(dataset)))
    return module, trainer, dataset, loss_before


def test_tiny_model_memorises_a_200_token_text(memorised, corpus):
    module, trainer, dataset, loss_before = memorised
    tokenizer, _ = corpus
    assert trainer.global_step == MEMORISE_STEPS
    assert loss_before > math.log(tokenizer.vocab_size) - 0.5  # starts near uniform
    assert float(trainer.callback_metrics["train/loss"]) < 0.1
    assert mean_loss(module, dataset) < 0.1  # on every window, after training


def test_memorised_model_recites_the_text_greedily(memorised, corpus):
    module, _, _, _ = memorised
    tokenizer, ids = corpus
    prompt = torch.tensor(ids[None, :4])
    out = module.model.generate(prompt, max_new_tokens=CONTEXT - 4, temperature=0)
    assert out[0].tolist() == ids[:CONTEXT].tolist()
    assert module.sample(
        tokenizer.decode(ids[:4]), max_new_tokens=CONTEXT - 4, temperature=0
    ) == tokenizer.decode(ids[:CONTEXT])


# ------------------------------------------------------------------ optimiser and schedule
def test_weight_decay_only_on_matrices(corpus, tmp_path):
    tokenizer, ids = corpus
    module = make_module(tokenizer, model={"positional": "learned"}, optim={"weight_decay": 0.05})
    trainer = fit(module, windows(ids), tmp_path, max_steps=1)
    groups = trainer.optimizers[0].param_groups
    assert len(groups) == 2
    decay, no_decay = groups
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert decay["params"] and no_decay["params"]
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"])

    # every parameter is in exactly one group
    grouped = [id(p) for g in groups for p in g["params"]]
    assert len(grouped) == len(set(grouped))
    assert set(grouped) == {id(p) for p in module.parameters()}

    named = dict(module.model.named_parameters())
    in_decay = {id(p) for p in decay["params"]}
    for name in (
        "token_embedding.weight",
        "position_embedding.weight",
        "head.weight",
        "blocks.0.attn.qkv.weight",
        "blocks.1.ffn.down.weight",
    ):
        assert id(named[name]) in in_decay, name
    for name in (
        "blocks.0.attn.qkv.bias",
        "blocks.0.ln1.weight",
        "blocks.0.ln1.bias",
        "ln_f.weight",
    ):
        assert id(named[name]) not in in_decay, name


def test_lr_factor_cosine():
    optim = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, schedule="cosine")
    total = 110
    factors = [lr_factor(step, optim, total) for step in range(total + 1)]
    warmup = factors[:10]
    # linear warm-up, reaching 1 at its last step
    assert warmup[0] == pytest.approx(0.1)
    steps = np.diff(warmup)
    assert np.allclose(steps, steps[0]) and steps[0] > 0
    assert warmup[-1] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0)  # decay starts from the peak
    decay = factors[10:]
    assert all(a >= b for a, b in zip(decay, decay[1:], strict=False))
    assert factors[60] == pytest.approx((1 + 0.1) / 2)  # half way down the cosine
    assert factors[total] == pytest.approx(optim.min_lr / optim.lr)
    assert lr_factor(total + 50, optim, total) == pytest.approx(optim.min_lr / optim.lr)
    assert min(factors) >= optim.min_lr / optim.lr - 1e-12


def test_lr_factor_cosine_without_warmup_starts_at_peak():
    optim = OptimConfig(lr=2e-3, min_lr=0.0, warmup_steps=0, schedule="cosine")
    assert lr_factor(0, optim, 100) == pytest.approx(1.0)
    assert lr_factor(100, optim, 100) == pytest.approx(0.0, abs=1e-12)


def test_lr_factor_constant_stays_one():
    optim = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, schedule="constant")
    assert {lr_factor(step, optim, 100) for step in range(0, 300, 7)} == {1.0}


def test_lr_factor_wsd_warms_up_holds_then_cools_down():
    """1-sqrt and linear cooldowns over the last 20% of 100 steps, down to min_lr."""
    optim = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, schedule="wsd")
    floor = optim.min_lr / optim.lr
    factors = [lr_factor(step, optim, 100) for step in range(101)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert set(factors[10:81]) == {1.0}  # the stable phase, its last step the cooldown's first
    assert cooldown_start(optim, 100) == 80
    assert factors[85] == pytest.approx(floor + (1 - floor) * (1 - math.sqrt(5 / 20)))
    assert factors[100] == pytest.approx(floor) and lr_factor(130, optim, 100) == pytest.approx(
        floor
    )
    cooldown = factors[80:]
    assert all(a > b for a, b in zip(cooldown, cooldown[1:], strict=False))
    linear = OptimConfig(
        lr=1e-3, min_lr=0.0, warmup_steps=0, schedule="wsd", cooldown_shape="linear"
    )
    assert lr_factor(90, linear, 100) == pytest.approx(0.5)
    assert lr_factor(90, replace(linear, cooldown_shape="1-sqrt"), 100) == pytest.approx(
        1 - math.sqrt(0.5)
    )


def test_a_branch_is_the_cooldown_of_the_wsd_run_that_starts_it_at_its_step():
    optim = OptimConfig(schedule="wsd", warmup_steps=5, cooldown_fraction=0.2)
    for step in range(5, 400):
        total = branch_length(optim, step)
        assert cooldown_start(optim, total) == step, step
        assert total - step == round(0.2 * total)  # that run's own cooldown
    assert branch_length(optim, 80) == 100
    with_branches = replace(optim, branch_at=[0.25, 0.5, 0.8])
    assert branch_steps(with_branches, 30) == [7, 15, 24] and cooldown_start(optim, 30) == 24


@pytest.mark.parametrize(
    ("settings", "total", "needle"),
    [
        ({"warmup_steps": 90}, 100, r"cooldown starts at step 80 of 100.*optim\.warmup_steps=90"),
        ({"branch_at": [0.02]}, 100, r"optim\.branch_at=\[0\.02\].*steps \[2\]"),
        ({"branch_at": [0.5, 0.501]}, 100, r"optim\.branch_at=.*distinct"),
    ],
)
def test_wsd_phases_are_checked_once_the_length_is_known(settings, total, needle):
    optim = OptimConfig(**{"schedule": "wsd", "warmup_steps": 10, **settings})
    with pytest.raises(ConfigError, match=needle):
        check_schedule(optim, total)


@pytest.mark.parametrize("schedule", ["cosine", "constant", "wsd"])
def test_trainer_applies_the_schedule(corpus, tmp_path, schedule):
    tokenizer, ids = corpus
    module = make_module(
        tokenizer, optim={"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 2, "schedule": schedule}
    )
    trainer = fit(module, windows(ids), tmp_path, max_steps=5)
    expected = 1e-3 * lr_factor(5, module.optim, 5)  # after 5 scheduler steps
    if schedule != "constant":
        assert expected == pytest.approx(1e-4)
    for group in trainer.optimizers[0].param_groups:
        assert group["lr"] == pytest.approx(expected)
        assert group["betas"] == (0.9, 0.95)


# ------------------------------------------------------------------ checkpoints
def test_checkpoint_rebuilds_the_module_alone(corpus, tmp_path):
    tokenizer, ids = corpus
    module = make_module(tokenizer, model={"tie_weights": True, "attention": "manual"})
    trainer = fit(module, windows(ids), tmp_path, max_steps=3, enable_checkpointing=True)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)

    # plain types only: loads without unpickling arbitrary objects
    checkpoint = torch.load(path, weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    assert hparams["model"]["tie_weights"] is True
    assert hparams["model"]["vocab_size"] == tokenizer.vocab_size
    assert hparams["tokenizer"] == tokenizer.state_dict()
    assert hparams["optim"]["betas"] == [0.9, 0.95]

    loaded = GPTModule.load_from_checkpoint(path, model=GPT(GPTConfig(**hparams["model"])))
    assert loaded.config == module.config
    assert loaded.optim == module.optim
    assert loaded.model.head.weight is loaded.model.token_embedding.weight
    module.eval()
    loaded.eval()
    x = windows(ids).tensors[0][:4]
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), module(x), rtol=0, atol=0)

    # the checkpoint's tokenizer encodes and decodes, so sample() works from it alone
    assert loaded.tokenizer.encode(TEXT) == ids.tolist()
    assert loaded.tokenizer.decode(ids) == TEXT
    prompt = tokenizer.decode(ids[:5])
    text = loaded.sample(prompt, max_new_tokens=6, temperature=0)
    assert text.startswith(prompt)
    assert text == module.sample(prompt, max_new_tokens=6, temperature=0)
    assert text != prompt


@pytest.mark.parametrize("first", [True, False])
def test_each_save_finds_its_step_already_in_tensorboard(corpus, tmp_path, first):
    """Lightning logs a step after the checkpoint its end saves: a kill -9 between the two lost
    the step from the curve for good (the resume starts at the next step). With
    StepLoggedBeforeSave each save finds it in TensorBoard's file, and it is there once."""
    tokenizer, ids = corpus
    on_disk = {}  # global step of a save -> train/loss steps in the file then

    class Probe(L.Callback):
        def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
            curve = scalars(tmp_path / "tb").get("train/loss", [])
            on_disk[trainer.global_step] = [step for step, _ in curve]

    last = LastCheckpoint(every_n_train_steps=4, dirpath=str(tmp_path / "checkpoints"))
    callbacks = [StepLoggedBeforeSave()] * first + [Probe(), last]
    logger = RunTensorBoardLogger(str(tmp_path), name="tb", version="")
    fit(
        make_module(tokenizer),
        windows(ids),
        tmp_path,
        12,
        batch_size=4,
        logger=logger,
        log_every_n_steps=2,
        enable_checkpointing=True,
        callbacks=callbacks,
    )
    logged = [1, 3, 5, 7, 9, 11]  # Lightning's: every 2nd step count, a step number less
    assert [step for step, _ in scalars(tmp_path / "tb")["train/loss"]] == logged
    assert sorted(on_disk) == [4, 8, 12]
    if first:
        assert on_disk == {4: [1, 3], 8: [1, 3, 5, 7], 12: logged}
    else:  # the loss this guards against
        assert on_disk[4] == [1] and on_disk[8] == [1, 3, 5]


def test_model_checkpoint_callback_file_loads(corpus, tmp_path):
    tokenizer, ids = corpus
    module = make_module(tokenizer)
    callback = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit(
        module, windows(ids), tmp_path, max_steps=2, enable_checkpointing=True, callbacks=[callback]
    )
    path = tmp_path / "ckpt" / "last.ckpt"
    assert path.exists()
    saved = torch.load(path, weights_only=True)
    # gptlab's bounded loader (the tools'), and Lightning's own with the GPT given, as
    # lightning-hydra-template loads a module whose net is passed in
    model, _, step = load_model(path)
    config = GPTConfig(**saved["hyper_parameters"]["model"])
    lightning_loaded = GPTModule.load_from_checkpoint(path, model=GPT(config)).eval()
    module.eval()
    x = windows(ids).tensors[0][:2]
    with torch.no_grad():
        torch.testing.assert_close(model(x), module(x), rtol=0, atol=0)
        torch.testing.assert_close(lightning_loaded(x), module(x), rtol=0, atol=0)
    assert step == 2


def test_validation_loss_is_the_token_mean(corpus, tmp_path):
    tokenizer, ids = corpus
    module = make_module(tokenizer)
    dataset = windows(ids, stride=5)
    trainer = make_trainer(tmp_path, max_steps=1)
    loader = DataLoader(dataset, batch_size=7)  # uneven last batch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PossibleUserWarning)
        trainer.validate(module, dataloaders=loader, verbose=False)
    expected = mean_loss(module, dataset)
    assert float(trainer.callback_metrics["val/loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(trainer.callback_metrics["val/perplexity"]) == pytest.approx(
        math.exp(expected), rel=1e-5
    )


# ------------------------------------------------------------------ optimiser config errors
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"lr": 0.0}, ["optim.lr=0.0"]),
        ({"lr": -1e-3}, ["optim.lr=-0.001"]),
        ({"schedule": "linear"}, ["optim.schedule='linear'", "cosine", "constant", "wsd"]),
        ({"cooldown_fraction": 1.0}, ["optim.cooldown_fraction=1.0", "(0, 1)"]),
        ({"cooldown_shape": "cosine"}, ["optim.cooldown_shape='cosine'", "1-sqrt", "linear"]),
        ({"branch_at": [0.5]}, ["optim.branch_at=[0.5]", "optim.schedule=wsd"]),
        ({"schedule": "wsd", "branch_at": [0.9]}, ["optim.branch_at=[0.9]", "(0, 0.8]"]),
        ({"betas": [0.9]}, ["optim.betas=[0.9]"]),
        ({"betas": [0.9, 1.0]}, ["optim.betas=[0.9, 1.0]"]),
        ({"betas": [-0.1, 0.95]}, ["optim.betas=[-0.1, 0.95]"]),
        ({"weight_decay": -0.1}, ["optim.weight_decay=-0.1"]),
        ({"warmup_steps": -1}, ["optim.warmup_steps"]),
        ({"min_lr": -1e-5}, ["optim.min_lr"]),
    ],
)
def test_bad_optim_config_is_a_clear_error(overrides, expected):
    with pytest.raises(ConfigError) as info:
        OptimConfig(**overrides)
    for text in expected:
        assert text in str(info.value)


def test_module_refuses_a_bad_model_config(corpus):
    tokenizer, _ = corpus
    with pytest.raises(ConfigError, match=r"model\.d_model=64.*model\.num_heads=3"):
        make_module(tokenizer, model={"d_model": 64, "num_heads": 3})


@pytest.mark.parametrize(
    "settings",
    [
        {"num_blocks": 2},
        {"num_blocks": 3, "ffn_mult": 2},
        {"num_blocks": 2, "activation": "swiglu"},  # three FFN matrices, 2/3 as wide
    ],
)
def test_declared_flops_match_what_torch_counts_for_a_training_step(settings):
    """flops_per_token (6 per weight + attention's 12·L·T·d) against Lightning's measure_flops of
    one real forward and backward pass (torch's FLOP counter: every matmul). The article's manual
    attention: on CPU the counter does not see inside the fused SDPA kernel."""
    from lightning.fabric.utilities.throughput import measure_flops

    from gptlab.model.gpt import GPT

    config = GPTConfig(
        vocab_size=500,
        context_length=32,
        d_model=64,
        num_heads=4,
        dropout=0.0,
        attention="manual",
        **settings,
    )
    model = GPT(config)
    ids = torch.randint(500, (4, 32))
    counted = measure_flops(model, lambda: model(ids), loss_fn=lambda logits: logits.sum())
    declared = model.flops_per_token() * ids.numel()
    assert counted == pytest.approx(declared, rel=0.02)
