"""gptlab-inspect: the articles' shapes, the figures, and attention maps from the real forward."""

from __future__ import annotations

import re

import matplotlib.image
import numpy as np
import pytest
import torch
from helpers import check, run_main, sign_run
from hydra import compose, initialize_config_module
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gptlab.cli.inspect_model import Step, inspect_model, random_model, run_job
from gptlab.errors import ConfigError
from gptlab.model.gpt import GPTConfig
from gptlab.run import directory
from gptlab.training.module import GPTModule, OptimConfig

PROMPT = (
    "Building rapport is a fundamental skill in sales that cannot be underestimated. It lays the "
    "foundation for establishing a connection with your potential customers, gaining their trust, "
    "and ultimately convincing them to make a purchase."
)
ARTICLE = {
    "context_length": 16,
    "d_model": 64,
    "num_heads": 4,
    "num_blocks": 1,
    "norm": "post",
    "attention": "manual",
    "dropout": 0.0,
}
FIGURES = [
    "positional_encoding",
    "attention_block0_scores",
    "attention_block0_masked",
    "attention_block0_softmax",
]
SHAPE_LINE = re.compile(r"^(?P<label>.+?)\s+(?P<shape>\[[\d, ]+\])\s")


def inspect_cli(*args: str, cwd):
    return run_main(*args, cwd=cwd, tool="gptlab-inspect")


def shape_lines(stdout: str) -> list[tuple[str, list[int]]]:
    found = [SHAPE_LINE.match(line) for line in stdout.splitlines()]
    return [(m["label"], [int(n) for n in m["shape"][1:-1].split(",")]) for m in found if m]


def assert_real_png(path):
    assert path.is_file() and path.stat().st_size > 5_000, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and len(np.unique(image)) > 1, path


def fake_run_dir(run) -> None:
    """A run directory whose checkpoint is saved the way gptlab-train saves one (plain types),
    holding a pre-LN sdpa model with two blocks: the other branch of every switch."""
    _, tokenizer = random_model(ARTICLE, PROMPT)
    config = GPTConfig(
        **{
            **ARTICLE,
            "norm": "pre",
            "attention": "sdpa",
            "num_blocks": 2,
            "vocab_size": tokenizer.vocab_size,
        }
    )
    hparams = GPTModule.hparams_from(config, OptimConfig(), tokenizer)
    (run / "checkpoints").mkdir(parents=True)
    torch.save(
        {
            "hyper_parameters": hparams,
            "state_dict": GPTModule.fresh(hparams).state_dict(),
            "global_step": 7,
        },
        run / "checkpoints" / "best.ckpt",
    )
    sign_run(run)


def test_cli_prints_the_articles_shapes_in_order_and_draws_the_figures(tmp_path):
    out = tmp_path / "inspect"
    result = check(inspect_cli(f"hydra.run.dir={out}", cwd=tmp_path))
    lines = shape_lines(result.stdout)
    labels = [label for label, _ in lines]
    shapes = dict(lines)
    vocab = shapes["logits"][-1]
    # the articles' order and their shapes for batch 4, context 16, d_model 64, 4 heads
    expected = [
        ("ids", [4, 16]),
        ("token embedding", [4, 16, 64]),
        ("+ positional encoding", [4, 16, 64]),
        ("block 0: Q, K, V (each)", [4, 16, 64]),
        ("block 0: heads (Q; K, V alike)", [4, 4, 16, 16]),
        ("block 0: scores Q.K^T/sqrt(head_size)", [4, 4, 16, 16]),
        ("block 0: mask (-inf above diagonal)", [4, 4, 16, 16]),
        ("block 0: softmax", [4, 4, 16, 16]),
        ("block 0: weighted sum (weights.V)", [4, 4, 16, 16]),
        ("block 0: merged heads", [4, 16, 64]),
        ("block 0: Wo", [4, 16, 64]),
        ("block 0: residual + LayerNorm", [4, 16, 64]),
        ("block 0: FFN hidden (ReLU)", [4, 16, 256]),
        ("block 0: FFN", [4, 16, 64]),
        ("logits", [4, 16, vocab]),
    ]
    positions = [labels.index(label) for label, _ in expected]
    assert positions == sorted(positions), labels
    for label, shape in expected:
        assert shapes[label] == shape, (label, shapes[label])
    assert labels.count("block 0: residual + LayerNorm") == 2  # Add & Norm after each sublayer
    assert 1 < vocab < 100  # the compact vocabulary fitted on the prompt
    for stem in FIGURES:
        assert_real_png(out / f"{stem}.png")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("block=3", "block=3: the model has 1 block(s)"),
        ("batch_size=0", "batch_size=0"),
        ("model.d_model=30", "model.d_model=30"),
    ],
)
def test_bad_arguments_exit_2_with_one_paragraph(override, message, caplog, tmp_path):
    """The tool's own task function on the composed config (a process per case is too slow)."""
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        cfg = compose("inspect", overrides=[override, f"output_dir={tmp_path}"])
    with pytest.raises(SystemExit) as exit_info:
        run_job(cfg)
    assert exit_info.value.code == 2
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert message in record.getMessage() and "\n" not in record.getMessage()


def test_traced_softmax_rows_sum_to_one_and_hide_the_future():
    model, tokenizer = random_model(ARTICLE, PROMPT)
    _, trace, tokens = inspect_model(model, tokenizer, PROMPT, batch_size=4, block=0)
    weights = trace["softmax"]  # [batch, num_heads, T, T]
    assert list(weights.shape) == [4, 4, 16, 16]
    above = torch.triu(torch.ones(16, 16, dtype=torch.bool), diagonal=1)
    torch.testing.assert_close(weights.sum(-1), torch.ones(4, 4, 16))
    assert torch.all(weights[..., above] == 0)
    assert torch.all(weights[..., ~above] > 0)
    assert torch.isinf(trace["masked"][..., above]).all() and torch.isfinite(trace["scores"]).all()
    torch.testing.assert_close(trace["masked"][..., ~above], trace["scores"][..., ~above])
    # the weighted sum is these weights times V, head by head
    v = trace["v"].view(4, 16, 4, 16).transpose(1, 2)
    torch.testing.assert_close(trace["weighted"], weights @ v)
    assert tokens[0] == "Building" and len(tokens) == 16


def test_each_step_is_a_named_record_with_the_real_shape():
    model, tokenizer = random_model(ARTICLE, PROMPT)
    steps, trace, _ = inspect_model(model, tokenizer, PROMPT, batch_size=2, block=0)
    assert all(isinstance(step, Step) for step in steps)
    assert steps[0] == Step("ids", [2, 16], "token ids: [batch, context_length]")
    assert steps[-1].label == "logits"
    assert steps[-1].shape == [2, 16, tokenizer.vocab_size]
    shapes = {step.label: step.shape for step in steps}
    assert shapes["block 0: softmax"] == list(trace["softmax"].shape) == [2, 4, 16, 16]
    assert shapes["block 0: Wo"] == list(trace["wo"].shape) == [2, 16, 64]


def test_sdpa_models_are_traced_through_their_own_forward():
    settings = {**ARTICLE, "attention": "sdpa", "norm": "pre", "num_blocks": 2}
    model, tokenizer = random_model(settings, PROMPT, seed=1)
    ids = torch.tensor([tokenizer.encode(PROMPT)[:16]])
    before = model(ids)
    _, trace, _ = inspect_model(model, tokenizer, PROMPT, batch_size=2, block=1)
    assert torch.equal(model(ids), before)  # inspecting changes nothing
    torch.testing.assert_close(trace["softmax"].sum(-1), torch.ones(2, 4, 16))
    assert list(trace["heads"].shape) == [2, 4, 16, 16]
    with pytest.raises(ConfigError, match="block=2"):
        inspect_model(model, tokenizer, PROMPT, block=2)
    with pytest.raises(ConfigError, match="batch_size"):
        inspect_model(model, tokenizer, PROMPT, batch_size=0)


def test_run_directory_figures_also_go_to_its_tensorboard(tmp_path, capsys):
    """The tool's task function in process (the CLI test above covers the process itself)."""
    fake_run_dir(tmp_path / "run")
    overrides = [
        f"ckpt_path={tmp_path / 'run'}",
        f"prompt='{PROMPT}'",
        "block=1",
        f"output_dir={tmp_path / 'out'}",
    ]  # prompt quoted: Hydra reads bare commas as a list
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        run_job(compose("inspect", overrides=overrides))
    lines = shape_lines(capsys.readouterr().out)
    labels = [label for label, _ in lines]
    assert dict(lines)["block 1: heads (Q; K, V alike)"] == [4, 4, 16, 16]
    assert (
        "block 1: LayerNorm" in labels
        and "final LayerNorm" in labels
        and "... x 2 blocks" in labels
    )
    stems = [s.replace("block0", "block1") for s in FIGURES]
    for stem in stems:
        assert_real_png(tmp_path / "out" / f"{stem}.png")
    run = directory.tensorboard_run(tmp_path / "run")
    events = EventAccumulator(str(run), size_guidance={"images": 0})
    events.Reload()
    assert sorted(events.Tags()["images"]) == sorted(f"inspect/{stem}" for stem in stems)
    assert events.Images("inspect/attention_block1_softmax")[0].step == 7
