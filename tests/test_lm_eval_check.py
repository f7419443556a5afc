"""Downstream scores checked against an independent implementation (docs/downstream.md): on a
tiny exported model and the same items, lm-evaluation-harness 0.4.13's own task definitions
(hellaswag, arc_easy, piqa, lambada_openai), pointed at the same local data, choose as gptlab
does on every item (scripts/lm_eval_check.py, whose full run on the default model's export the
docs report); and gptlab-eval scores a checkpoint and its export alike (within 1e-4)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness (the dev extra)")
pytest.importorskip("transformers", reason="needs the export extra")

from helpers import check, run_main  # noqa: E402
from test_tasks import HELLASWAG, lambada, save  # noqa: E402

from gptlab.data import tasks as task_data  # noqa: E402
from gptlab.model.config import GPTConfig  # noqa: E402
from gptlab.model.gpt import GPT  # noqa: E402
from gptlab.training.module import GPTModule  # noqa: E402

TASKS = ["hellaswag", "arc_easy", "piqa", "lambada"]
SUBJECTS = ["plants", "the moon", "a magnet", "ice", "a battery", "rain", "sound", "a lens"]
ARC = {
    "id": [f"q{i}" for i in range(8)],
    "question": [f"Which is true of {s}?" for s in SUBJECTS],
    "choices": [
        {
            "text": ["It grows.", "It melts in the sun.", "It attracts iron.", "It stores energy."],
            "label": ["A", "B", "C", "D"] if i % 2 else ["1", "2", "3", "4"],
        }
        for i in range(8)
    ],  # fmt: skip
    "answerKey": ["1", "B", "3", "D", "2", "A", "4", "C"],
}
PIQA = {
    "goal": [f"How do I keep {s} safe?" for s in SUBJECTS],
    "sol1": [f"Put {s} in a dry box." for s in SUBJECTS],
    "sol2": [f"Leave {s} out in the rain all night long." for s in SUBJECTS],
    "label": [i % 2 for i in range(8)],
}
PASSAGES = [
    ("She opened the door and saw the", " garden"),
    ("He paid for the shoes with his", " card"),
    ("The children ran down to the", " beach"),
    ("After the rain the road was", " wet"),
]


def checkpoint(path: Path) -> None:
    """A checkpoint as gptlab-train saves one (its hyperparameters, weights under `model.`, step):
    a GPT of the whole cl100k_base vocabulary (exportable), its weights drawn far from init."""
    config = GPTConfig(
        vocab_size=100277, context_length=64, d_model=16, num_heads=2, num_blocks=1, dropout=0.0
    )
    torch.manual_seed(0)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    hparams = {
        "model": dataclasses.asdict(config),
        "optim": {},
        "tokenizer": {"encoding": "cl100k_base", "vocab": None},
    }
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"hyper_parameters": hparams, "state_dict": state, "global_step": 5}, path)
    assert GPTModule.fresh(hparams).model.config == config  # what gptlab-train would rebuild


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """model.ckpt, its export (gptlab-export), and the four tasks' data in the wheel's layout."""
    root = tmp_path_factory.mktemp("lm_eval_check")
    checkpoint(root / "model.ckpt")
    check(run_main("ckpt_path=model.ckpt", "out=exported", cwd=root, tool="gptlab-export"))
    data = root / "data"
    save(data, task_data.TASKS["hellaswag"].folder, HELLASWAG)
    save(data, task_data.TASKS["arc_easy"].folder, ARC)
    save(data, task_data.TASKS["piqa"].folder, PIQA)
    lambada(data, PASSAGES)
    return root


def eval_json(root: Path, target: str, out: str) -> dict:
    result = run_main(
        f"ckpt_path={target}",
        f"tasks=[{','.join(TASKS)}]",
        f"data.data_dir={root / 'data'}",
        f"data.cache_dir={root / 'cache'}",
        "downstream.batch_size=5",
        f"hydra.run.dir={out}",
        cwd=root,
        tool="gptlab-eval",
    )
    check(result)
    assert "| hellaswag |" in result.stdout and "| mean |" in result.stdout
    [saved] = json.loads((root / out / "eval.json").read_text()).values()
    return saved


def test_gptlab_eval_scores_a_checkpoint_and_its_export_alike(root):
    ours, exported = (
        eval_json(root, "model.ckpt", "out_ckpt"),
        eval_json(root, "exported", "out_hf"),
    )
    assert ours["step"] == 5
    for name in TASKS:
        a, b = ours["downstream"][name], exported["downstream"][name]
        assert a["n"] == b["n"] > 0 and a["n_oov"] == 0
        for key in ("acc", "acc_norm", "bpb", "centred"):
            assert a[key] == pytest.approx(b[key], abs=1e-4), (name, key)
    assert ours["aggregate"]["tasks"] == TASKS


def test_lm_eval_chooses_as_gptlab_does_on_every_item(root):
    from scripts.lm_eval_check import check as lm_eval_check

    found = lm_eval_check(
        root / "exported", root / "data", root / "cache", TASKS, None, "cpu", batch=8
    )
    sizes = {"hellaswag": 2, "arc_easy": 8, "piqa": 8, "lambada": len(PASSAGES)}
    for name, f in found.items():
        assert f["n"] == sizes[name] and f["left_out"] == 0
        assert f["same_choice"] == 1.0 and f["same_choice_norm"] == 1.0, (name, f)
        assert f["gptlab_acc"] == f["lm_eval_acc"] and f["gptlab_acc_norm"] == f["lm_eval_acc_norm"]
        assert f["max_loglikelihood_diff"] < 1e-3, (name, f)
