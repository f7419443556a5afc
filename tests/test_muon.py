"""`optim=muon`: Muon (torch's, its Newton-Schulz iteration in float32 on CPU) for the blocks'
matrices and AdamW for the rest, one optimizer to Lightning. Its update against torch's, its
parameter split, one schedule for both, a step count that is not doubled, gradient
clipping; then real gptlab-train runs: an exact resume, DDP over 2 CPU processes with bf16."""

from __future__ import annotations

import math
import os
import subprocess
import time

import pytest
import torch
from helpers import BIN, check, read_metrics, run_cli, run_main
from test_module import corpus, fit, make_module, windows  # noqa: F401 - corpus is a fixture

from gptlab.errors import ConfigError
from gptlab.training.module import OptimConfig, lr_factor
from gptlab.training.optimizers import Muon, MuonWithAdamW, orthogonalise

NS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's coefficients, torch's Muon default
MUON = {"name": "muon", "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 2, "muon_lr": 0.02}
TINY = [
    "debug=fast",
    "optim=muon",
    "trainer.max_steps=20",
    "trainer.deterministic=true",
    "model.dropout=0.1",
    "callbacks.last_checkpoint.every_n_train_steps=5",
]


def test_muon_takes_the_block_matrices_and_adamw_the_rest(corpus, tmp_path):  # noqa: F811
    tokenizer, ids = corpus
    module = make_module(tokenizer, model={"positional": "learned"}, optim=MUON)
    trainer = fit(module, windows(ids), tmp_path, max_steps=1)
    optimizer = trainer.optimizers[0]
    assert isinstance(optimizer, MuonWithAdamW)
    assert type(optimizer.muon) is Muon  # ours: the float32 Newton-Schulz step on CPU
    assert isinstance(optimizer.adamw, torch.optim.AdamW)
    (muon_group,) = optimizer.muon.param_groups
    named = dict(module.model.named_parameters())
    in_muon = {id(p) for p in muon_group["params"]}
    block_matrices = {
        n for n, p in named.items() if n.startswith("blocks.") and p.dim() == 2
    }  # qkv, proj, ffn.up, ffn.down of each block
    assert {n for n, p in named.items() if id(p) in in_muon} == block_matrices
    assert len(block_matrices) == 4 * 2
    in_adamw = [id(p) for g in optimizer.adamw.param_groups for p in g["params"]]
    assert set(in_adamw).isdisjoint(in_muon) and len(in_adamw) == len(set(in_adamw))
    assert set(in_adamw) | in_muon == {id(p) for p in module.parameters()}
    for name in ("token_embedding.weight", "position_embedding.weight", "head.weight"):
        assert id(named[name]) in in_adamw, name
    # the wrapper's groups are the two optimizers' own dicts
    assert optimizer.param_groups == optimizer.muon.param_groups + optimizer.adamw.param_groups
    both = optimizer.muon.param_groups + optimizer.adamw.param_groups
    assert all(a is b for a, b in zip(optimizer.param_groups, both, strict=True))
    # Muon shrinks a matrix per step as AdamW would: weight_decay * lr / muon_lr
    assert muon_group["weight_decay"] == pytest.approx(0.1 * 1e-3 / 0.02)
    assert muon_group["adjust_lr_fn"] == "original" and muon_group["momentum"] == 0.95


def test_one_schedule_for_both_and_one_step_a_batch(corpus, tmp_path):  # noqa: F811
    """After 5 steps both optimizers' lr are their peaks times the same factor; global_step is 5
    (two optimizers under manual optimization would count 10); clipping bounds the grad norm."""
    tokenizer, ids = corpus
    module = make_module(tokenizer, optim=MUON)
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    trainer = fit(module, windows(ids), tmp_path, max_steps=5, gradient_clip_val=0.5)
    assert trainer.global_step == 5
    factor = lr_factor(5, module.optim, 5)
    optimizer = trainer.optimizers[0]
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(0.02 * factor)
    for group in optimizer.adamw.param_groups:
        assert group["lr"] == pytest.approx(1e-3 * factor)
    state = optimizer.state_dict()
    assert set(state) == {"muon", "adamw"}
    assert all("momentum_buffer" in s for s in state["muon"]["state"].values())
    assert all(int(s["step"]) == 5 for s in state["adamw"]["state"].values())
    for name, p in module.model.named_parameters():  # both optimizers moved their weights
        assert not torch.equal(p, before[name]), name


def test_muon_keeps_the_loss_falling(corpus, tmp_path):  # noqa: F811
    tokenizer, ids = corpus
    module = make_module(tokenizer, optim={**MUON, "lr": 3e-3, "min_lr": 3e-4})
    dataset = windows(ids, stride=4)
    x, y = dataset.tensors
    with torch.no_grad():
        start = float(module.loss((x, y)))
    fit(module, dataset, tmp_path, max_steps=40, gradient_clip_val=1.0)
    with torch.no_grad():
        end = float(module.eval().loss((x, y)))
    assert end < start - 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # CPU's, CUDA's
@pytest.mark.parametrize("shape", [(384, 128), (128, 512)])
def test_orthogonalise_runs_in_the_dtype_it_is_given(shape, dtype):
    """Newton-Schulz in float32 on CPU (torch's casts to bf16, slow on CPUs without bf16
    instructions) and in bf16 as on CUDA: a gradient whose singular values span 10x comes out
    with them all near 1 (Keller Jordan's coefficients leave them in about 0.5 to 1.5), pointing
    along the SVD's U V^T."""
    torch.manual_seed(0)
    u, _, v = torch.linalg.svd(torch.randn(shape), full_matrices=False)
    spread = torch.logspace(0, 1, min(shape))
    grad = u @ torch.diag(spread) @ v
    out = orthogonalise(grad, NS, steps=5, eps=1e-7, dtype=dtype)
    assert out.dtype == dtype and out.shape == grad.shape
    out = out.float()
    singular = torch.linalg.svdvals(out)
    assert singular.min() > 0.5 and singular.max() < 1.5
    cosine = (out * (u @ v)).sum() / (out.norm() * (u @ v).norm())
    assert cosine > 0.9


def test_our_muon_orthogonalises_in_float32_on_cpu():
    """The step itself picks float32 on CPU: with float32 the update is exact to float32's
    rounding, so it differs from the bf16 iteration's by more than float32 would."""
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.zeros(384, 128))
    param.grad = torch.randn(384, 128)
    Muon([param], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False).step()
    factor = math.sqrt(384 / 128)  # the original shape adjustment
    for dtype, close in ((torch.float32, True), (torch.bfloat16, False)):
        expected = -factor * orthogonalise(param.grad, NS, 5, 1e-7, dtype).float()
        assert torch.allclose(param.detach(), expected, rtol=0, atol=1e-5) is close, dtype


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
def test_our_muon_steps_where_torchs_does_and_shares_its_state(adjust):
    """Three steps (momentum, Nesterov, decoupled decay, lr by shape) on a tall and a wide matrix
    land where torch.optim.Muon's land, to its bf16 rounding; each loads the other's state."""
    torch.manual_seed(0)
    shapes = [(384, 128), (128, 512)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    start = [p.detach().clone() for p in ours]
    kwargs = {"lr": 0.02, "weight_decay": 0.5, "adjust_lr_fn": adjust}
    mine, torchs = Muon(ours, **kwargs), torch.optim.Muon(theirs, **kwargs)
    for _ in range(3):
        for p, q in zip(ours, theirs, strict=True):
            p.grad = torch.randn(p.shape)
            q.grad = p.grad.clone()
        mine.step()
        torchs.step()
    for p, q, p0 in zip(ours, theirs, start, strict=True):
        moved = (q - p0).abs().max()
        assert moved > 0.01
        assert (p - q).abs().max() < 0.02 * moved  # bf16 keeps about 3 significant digits
    theirs_state = torchs.state_dict()
    again = Muon([torch.nn.Parameter(q.detach().clone()) for q in theirs], **kwargs)
    again.load_state_dict(theirs_state)
    torchs.load_state_dict(mine.state_dict())
    for key in range(len(shapes)):
        buffer = theirs_state["state"][key]["momentum_buffer"]
        assert torch.equal(again.state_dict()["state"][key]["momentum_buffer"], buffer)
        buffer = mine.state_dict()["state"][key]["momentum_buffer"]
        assert torch.equal(torchs.state_dict()["state"][key]["momentum_buffer"], buffer)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"name": "sgd"}, "optim.name='sgd'"),
        ({"muon_lr": 0}, "optim.muon_lr=0"),
        ({"muon_momentum": 1.0}, "optim.muon_momentum=1.0"),
        ({"muon_adjust_lr": "moonshot"}, "optim.muon_adjust_lr='moonshot'"),
    ],
)
def test_bad_muon_config_is_a_clear_error(overrides, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        OptimConfig(**overrides)


# ------------------------------------------------------------------ real runs
def test_muon_run_killed_at_a_save_resumes_exactly(tmp_path):
    """20 steps in one go, against a run SIGKILLed once its first last.ckpt is written, then
    continued with `resume=`: the same weights, as both optimizers' states (Muon's momentum,
    AdamW's moments) and the schedule come back from the checkpoint."""
    check(run_main(*TINY, "hydra.run.dir=whole", cwd=tmp_path))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    killed = subprocess.Popen(
        [str(BIN / "gptlab-train"), *TINY, "hydra.run.dir=killed"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    last = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 300
    while not last.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    killed.kill()
    killed.wait()
    assert last.exists()
    stopped_at = torch.load(last, weights_only=True)["global_step"]
    assert stopped_at < 20  # killed before the end
    check(run_main(f"resume={tmp_path / 'killed'}", cwd=tmp_path))
    whole, resumed = (
        torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)
        for run in ("whole", "killed")
    )
    assert whole["global_step"] == resumed["global_step"] == 20
    for name, tensor in whole["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, rtol=0, atol=1e-6)
    muon_whole, muon_resumed = (c["optimizer_states"][0]["muon"] for c in (whole, resumed))
    for key, state in muon_whole["state"].items():
        torch.testing.assert_close(
            muon_resumed["state"][key]["momentum_buffer"], state["momentum_buffer"]
        )


def test_muon_trains_under_ddp_with_bf16(tmp_path):
    result = check(
        run_cli(
            "debug=fast",
            "optim=muon",
            "model=modern",
            "trainer=ddp_cpu",
            "trainer.precision=bf16-mixed",
            "hydra.run.dir=run",
            cwd=tmp_path,
        )
    )
    metrics = read_metrics(tmp_path / "run")
    assert metrics["status"] == "ok" and metrics["device"] == "cpu x2"
    assert metrics["steps"] == 30 and math.isfinite(metrics["best_val_loss"])
    assert result.stderr.count("Done: ") == 1
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert set(saved["optimizer_states"][0]) == {"muon", "adamw"}


def test_the_speedrun_recipe_trains(tmp_path):
    """`experiment=speedrun` as shipped (6 blocks, model=modern, Muon, weight decay 2.0), cut to
    4 steps: it composes, trains with Muon's float32 step and says what it trained."""
    check(
        run_main(
            "experiment=speedrun",
            "trainer.max_steps=4",
            "trainer.val_check_interval=2",
            "trainer.limit_val_batches=2",
            "callbacks.text_sample.max_new_tokens=1",
            "hydra.run.dir=run",
            cwd=tmp_path,
        )
    )
    metrics = read_metrics(tmp_path / "run")
    assert metrics["status"] == "ok" and metrics["steps"] == 4
    assert math.isfinite(metrics["best_val_loss"])
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    config = saved["hyper_parameters"]
    assert config["model"]["num_blocks"] == 6 and config["optim"]["weight_decay"] == 2.0
    assert len(saved["optimizer_states"][0]["muon"]["state"]) == 6 * 4  # qkv, Wo, up, down
