"""gptlab-export and init_from (docs/export.md): transformers loads each exported folder offline,
without remote code, and computes gptlab's log-probabilities; the folder reads back as the same
weights; what no class holds is refused; a foreign run is only read."""

import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import re
import shlex
import shutil
import warnings
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="needs the export extra: pip install -e '.[export]'")

import torch  # noqa: E402
from helpers import check, read_metrics, run_cli, run_main  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from gptlab.data.hf_tokenizer import oniguruma, to_transformers  # noqa: E402
from gptlab.data.tokenizer import Tokenizer  # noqa: E402
from gptlab.errors import ConfigError  # noqa: E402
from gptlab.model import mup  # noqa: E402
from gptlab.model.config import GPTConfig  # noqa: E402
from gptlab.model.gpt import GPT  # noqa: E402
from gptlab.model.hf import to_hf
from gptlab.model.hf_config import model_type  # noqa: E402
from gptlab.run.checkpoints import Trained  # noqa: E402
from gptlab.run.hf_folder import check_exportable, read_folder, write_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASK = "gptlab_next_sentence"  # scripts/next_sentence_task.py's
ENCODING = "cl100k_base"
VOCAB = 100277  # cl100k_base's ids, the whole vocabulary (data.compact_vocab=false)
LLAMA = dict(positional="rope", norm_layer="rmsnorm", activation="swiglu", bias=False)
MODERN = dict(positional="rope", norm_layer="rmsnorm", activation="relu2", qk_norm=True)
ARCHITECTURES = {  # the settings -> the class that holds them
    "default": ({}, "GPT2LMHeadModel"),
    "learned": (dict(positional="learned"), "GPT2LMHeadModel"),
    "gelu_new": (dict(activation="gelu_new", norm_eps=1e-6), "GPT2LMHeadModel"),
    "llama": (LLAMA, "LlamaForCausalLM"),
    "llama eps, base": (dict(LLAMA, norm_eps=1e-6, rope_theta=5e5), "LlamaForCausalLM"),
    "post-LN tied": (dict(norm="post", tie_weights=True), "OPTForCausalLM"),
    "modern, no bias": (dict(MODERN, bias=False), "ApertusForCausalLM"),
    "qk_norm swiglu tied": (dict(LLAMA, qk_norm=True, tie_weights=True), "Qwen3ForCausalLM"),
}


MUP = dict(parametrization="mup", base_width=16, base_depth=1)  # width 2x, depth 2x the base
# what a user's text holds beyond the book: the pieces generated texts are made of
WORDS = ["the", "Sales", "PRICE", "naïve", "café", "Straße", "ÉCOLE", "über", "señor", "I", "x"]
WORDS += ["日本語", "销售", "한국어", "Привет", "مرحبا", "שלום", "नमस्ते", "ελληνικά"]
SUFFIXES = ["'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'d"]
SUFFIXES += ["'D", "’s", "'"]
DIGITS = ["0123456789"] * 6 + ["٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹½Ⅻ"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\t \n ", "\u00a0", "\u3000", "\x0b"]
SYMBOLS = [*"$€£¥%.,;:!?()[]{}<>/\\|-_=+*&^#@~`\"'", "😀", "👍🏽", "🇫🇷", "👨‍👩‍👧", "→", "…", "—"]
CODE = ["def f(x):\n    return x**2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}"]
CODE += ["if x != None and y >= 3:", "const s = `${a}`;", '<td class="a">1,234</td>', "\t\t# c\n"]


def number(rng: random.Random) -> str:
    """A number of 1 to 14 digits: plain, a price, a decimal, thousands, a percentage."""
    digits = rng.choice(DIGITS)
    n = "".join(rng.choice(digits) for _ in range(rng.randint(1, 14)))
    return rng.choice(
        [n, f"${n}.{rng.randint(0, 99):02d}", f"{n}.{n[::-1]}", f"{n[:3]},{n}", n + "%"]
    )


def generated_texts(count: int, seed: int = 0) -> list[str]:
    """Texts of words (both cases, contractions), numbers, space runs, symbols, emoji, code."""
    rng = random.Random(seed)
    kinds = [
        lambda: rng.choice(WORDS) + (rng.choice(SUFFIXES) if rng.random() < 0.3 else ""),
        lambda: rng.choice(WORDS).upper() + rng.choice(SUFFIXES),
        lambda: number(rng),
        lambda: "".join(rng.choices(SPACES, k=rng.randint(1, 3))),
        lambda: rng.choice(SYMBOLS),
        lambda: rng.choice(CODE),
    ]
    texts = []
    for _ in range(count):
        pieces = [rng.choice(kinds)() for _ in range(rng.randint(1, 12))]
        texts.append("".join(p if rng.random() < 0.5 else " " + p for p in pieces))
    return ["In 2024 it cost $1,234,567.89", *texts]


@pytest.fixture(scope="module")
def val_ids(corpus_text) -> list[int]:
    """64 tokens of the val split (the last tenth of the book), as gptlab encodes them."""
    ids = Tokenizer(ENCODING).encode(corpus_text)
    return ids[int(len(ids) * 0.9) :][:64]


def random_model(**settings) -> tuple[GPTConfig, GPT]:
    """A debug-sized GPT whose every weight matters (no zeros, no ones left from init)."""
    config = GPTConfig(vocab_size=VOCAB, context_length=64, d_model=32, num_heads=2, num_blocks=2)
    config = dataclasses.replace(config, dropout=0.0, **settings)
    torch.manual_seed(0)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return config, model


def trained_of(config: GPTConfig, model: GPT) -> Trained:
    """The model as run/checkpoints.read_trained gives a checkpoint's."""
    weights = {f"model.{k}": v for k, v in model.state_dict().items()}
    return Trained(dataclasses.asdict(config), {"encoding": ENCODING, "vocab": None}, weights, 7)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_transformers_computes_gptlab_log_probs(name, tmp_path, val_ids):
    settings, expected = ARCHITECTURES[name]
    config, model = random_model(**settings)
    out = tmp_path / "exported"
    write_folder(trained_of(config, model), model, out, "card\n")

    hf, info = AutoModelForCausalLM.from_pretrained(
        out, local_files_only=True, output_loading_info=True
    )
    assert type(hf).__name__ == expected
    assert not any(info.values()), info  # no weight missing, unexpected or mismatched
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = Tokenizer(ENCODING).decode(val_ids)
    assert tokenizer(text)["input_ids"] == val_ids
    ids = torch.tensor([val_ids])
    with torch.no_grad():
        ours = torch.log_softmax(model(ids), dim=-1)
        theirs = torch.log_softmax(hf.eval()(ids).logits, dim=-1)
    assert (ours - theirs).abs().max().item() <= 1e-4

    # import: the same settings and weights; the token embedding as the model uses it (times
    # sqrt(d_model), folded into the export) bit for bit, and a second export is the first
    back = read_folder(out)
    assert back.model == trained_of(config, model).model
    original = trained_of(config, model).weights
    assert set(back.weights) == set(original)
    scale = math.sqrt(config.d_model)
    for key, tensor in original.items():
        if key in ("model.token_embedding.weight", "model.head.weight") or config.tie_weights:
            continue
        assert torch.equal(back.weights[key], tensor), key
    embedding = "model.token_embedding.weight"
    assert torch.equal(back.weights[embedding] * scale, original[embedding] * scale)
    if not config.tie_weights:
        assert torch.equal(back.weights["model.head.weight"], original["model.head.weight"])
    written = load_file(out / "model.safetensors")
    state = {k.removeprefix("model."): v for k, v in back.weights.items()}
    again = to_hf(GPTConfig(**back.model), state)  # what a second export writes
    assert set(written) <= set(again)
    assert all(torch.equal(written[k], again[k]) for k in written)


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_the_tokenizer_gives_tiktokens_ids_on_any_text(encoding, tmp_path):
    """3,000 generated texts, 0 differences: the pattern Oniguruma reads as tiktoken reads it
    (a possessive interval misread split every number of 4 digits or more differently)."""
    to_transformers(encoding, 64).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    texts = generated_texts(3000)
    ids = tokenizer(texts)["input_ids"]
    expected = [Tokenizer(encoding).encoding.encode_ordinary(text) for text in texts]
    differ = [text for text, a, b in zip(texts, ids, expected, strict=True) if a != b]
    assert differ == []
    assert sum(len(x) for x in expected) > 50_000
    # a special token's string in the text is plain text on both sides, as gptlab trains on it
    ours = Tokenizer(encoding)
    specials = ours.encoding.special_tokens_set
    assert {"<|endoftext|>", "<|endofprompt|>"} <= specials
    for special in sorted(specials):
        text = f"Say {special} twice:{special}\n{special}."
        assert tokenizer(text)["input_ids"] == ours.encode(text), special
        special_id = ours.encoding.encode_single_token(special)
        assert special_id not in ours.encode(text) and len(ours.encode(special)) > 1
        assert tokenizer.decode([special_id]) == special  # the id still names the token
    with pytest.raises(ValueError, match="possessive interval"):
        oniguruma(r"(ab){1,3}+")  # no atom: not rewritten, refused


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_mup_model_exports_with_its_multipliers(name, tmp_path, val_ids):
    """Every multiplier differs from the standard one; each class holds them all, folded in."""
    config, model = random_model(**ARCHITECTURES[name][0], **MUP)
    s = mup.scales(config)
    assert s.embedding != math.sqrt(config.d_model) and s.attention != config.head_size**-0.5
    assert s.output != 1.0 and s.residual != 1.0
    out = tmp_path / "exported"
    write_folder(trained_of(config, model), model, out, "card\n")
    hf = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    back = read_folder(out)  # imported: a standard model computing the same function
    imported = GPT(GPTConfig(**back.model)).eval()
    imported.load_state_dict({k.removeprefix("model."): v for k, v in back.weights.items()})
    assert back.model["parametrization"] == "standard"
    ids = torch.tensor([val_ids])
    with torch.no_grad():
        ours = torch.log_softmax(model(ids), dim=-1)
        for theirs in (hf(ids).logits, imported(ids)):
            assert (ours - torch.log_softmax(theirs, dim=-1)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", ["default", "post-LN tied"])
def test_bias_false_reads_back_as_zero_biases_that_train(name, tmp_path, val_ids):
    """GPT-2 and OPT always hold biases: a `bias=false` model is exported with zero biases, and
    read back as what the folder holds, biases (zero, the same function), which a fine-tune then
    trains: never `bias=false` inferred from their values."""
    config, model = random_model(**ARCHITECTURES[name][0], bias=False)
    out = tmp_path / "exported"
    write_folder(trained_of(config, model), model, out, "card\n")
    back = read_folder(out)
    assert back.model == {**trained_of(config, model).model, "bias": True}
    imported = GPT(GPTConfig(**back.model)).eval()
    imported.load_state_dict({k.removeprefix("model."): v for k, v in back.weights.items()})
    biases = [key for key in back.weights if key.endswith(".bias")]
    assert biases and not any(back.weights[key].any() for key in biases)
    ids = torch.tensor([val_ids])
    with torch.no_grad():
        ours, theirs = model(ids).log_softmax(-1), imported(ids).log_softmax(-1)
    assert (ours - theirs).abs().max().item() <= 1e-4


@contextlib.contextmanager
def transformers_says():
    """Every warning and log record transformers gives meanwhile (its logger's handlers: its own
    logging module's; Python's warnings), as a list of strings."""
    said, handler = [], logging.Handler(logging.DEBUG)
    handler.emit = lambda record: said.append(record.getMessage())
    logger = hf_logging.get_logger("transformers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield said
    finally:
        logger.removeHandler(handler)
    said += [str(w.message) for w in caught]


@pytest.mark.parametrize("name", ["default", "post-LN tied", "llama"])
def test_pipeline_defaults_stay_in_the_window(name, tmp_path):
    """pipeline("text-generation") asks for 256 new tokens, past a 16-token model's position
    table; the export's generation_config asks for half the window instead (8), as a number of
    new tokens: a max_length there made every call passing max_new_tokens warn "Both
    `max_new_tokens` and `max_length` seem to have been set". Batches pad on the left with the
    end-of-text token."""
    config, model = random_model(**ARCHITECTURES[name][0], context_length=16)
    out = tmp_path / "exported"
    write_folder(trained_of(config, model), model, out, "card\n")
    generator = pipeline("text-generation", model=str(out))
    assert generator.tokenizer.model_max_length == 16
    torch.manual_seed(0)
    with transformers_says() as said:
        [one] = generator("The salesperson")
        assert one["generated_text"].startswith("The salesperson")
        assert len(generator(["a", "The salesperson said"])) == 2
        batch = generator(["a", "The salesperson said"], batch_size=2, return_tensors=True)
        [three] = generator("The salesperson", max_new_tokens=3, return_tensors=True)
    assert said == []  # nothing at all: no length warning, no padding warning
    saved = json.loads((out / "generation_config.json").read_text())
    assert saved["max_new_tokens"] == 8 and "max_length" not in saved
    rows = [result["generated_token_ids"] for [result] in batch]
    prompt = len(generator.tokenizer("The salesperson said")["input_ids"])
    assert [len(row) for row in rows] == [prompt + 8] * 2 and prompt + 8 <= 16
    asked = generator.tokenizer("The salesperson")["input_ids"]
    assert len(three["generated_token_ids"]) == len(asked) + 3
    eos, [a] = generator.tokenizer.eos_token_id, generator.tokenizer("a")["input_ids"]
    assert rows[0][:prompt] == [eos] * (prompt - 1) + [a]  # padded on the left


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (dict(logit_softcap=30.0), "model.logit_softcap=30.0"),
        (MODERN, "model.bias=True"),  # model=modern: ApertusForCausalLM has no FFN biases
        (dict(norm="post", positional="rope", norm_layer="rmsnorm"), "model.norm=post"),
        (dict(norm="post", norm_eps=1e-6), "OPTForCausalLM not model.norm_eps=1e-06"),
    ],
)
def test_what_no_class_holds_is_refused(settings, named):
    config = GPTConfig(vocab_size=VOCAB, d_model=32, num_heads=2, **settings)
    with pytest.raises(ConfigError) as refused:
        model_type(config)
    message = str(refused.value)
    assert named in message
    assert "GPT2LMHeadModel" in message and "LlamaForCausalLM" in message


def test_compact_vocabulary_is_refused():
    config, model = random_model()
    trained = trained_of(config, model)._replace(tokenizer={"encoding": ENCODING, "vocab": [1, 2]})
    with pytest.raises(ConfigError, match="data.compact_vocab=false"):
        check_exportable(trained)


# ------------------------------------------------------------------------------------------------
# the command line, on a real run of the whole vocabulary


@pytest.fixture(scope="module")
def full_vocab_run(tmp_path_factory) -> Path:
    """gptlab-train debug=fast data.compact_vocab=false (the must-hold's run), exported once."""
    cwd = tmp_path_factory.mktemp("full_vocab")
    check(run_main("debug=fast", "data.compact_vocab=false", "hydra.run.dir=run", cwd=cwd))
    check(run_main("ckpt_path=run", "out=exported", cwd=cwd, tool="gptlab-export"))
    return cwd / "run"


def test_export_gives_gptlab_eval_loss(full_vocab_run, corpus_text):
    """The must-hold: the exported folder's loss on the val windows gptlab-eval scores (debug=fast
    validates 4 batches of 8 windows of 32 tokens) is gptlab-eval's, within 1e-4."""
    from gptlab.data.datamodule import GPTDataModule

    cwd = full_vocab_run.parent
    result = check(run_main(f"ckpt_path={full_vocab_run}", cwd=cwd, tool="gptlab-eval"))
    eval_loss = float(re.search(r"val loss: +([\d.]+)", result.stdout).group(1))
    exported = cwd / "exported"
    hf = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True).eval()
    data = GPTDataModule(compact_vocab=False, context_length=32, batch_size=8,
                         data_dir=os.environ.get("GPTLAB_DATA_DIR", "data"),
                         cache_dir=str(cwd / "cache"))  # fmt: skip
    data.prepare_data()
    data.setup("validate")
    total, count = 0.0, 0
    with torch.no_grad():
        for _, (x, y) in zip(range(4), data.val_dataloader(), strict=False):
            logits = hf(x).logits
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), y.flatten(), reduction="sum"
            )
            count += y.numel()
    assert abs(total.item() / count - eval_loss) <= 1e-4
    # the tokenizer: gptlab's ids on the whole book, tiktoken's on texts beyond it
    tokenizer = AutoTokenizer.from_pretrained(exported, local_files_only=True)
    assert tokenizer(corpus_text)["input_ids"] == Tokenizer(ENCODING).encode(corpus_text)
    texts = generated_texts(3000, seed=1)
    expected = [Tokenizer(ENCODING).encoding.encode_ordinary(text) for text in texts]
    assert tokenizer(texts)["input_ids"] == expected
    card = (exported / "README.md").read_text()
    assert "reads at most 32 tokens" in card and "sliding window" in card
    assert "gptlab-train debug=fast data.compact_vocab=false" in card
    assert f"best val loss: {read_metrics(full_vocab_run)['best_val_loss']}" in card


def test_export_refuses_a_folder_that_holds_something(full_vocab_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = run_main(
        f"ckpt_path={full_vocab_run}", f"out={out}", cwd=tmp_path, tool="gptlab-export"
    )
    assert result.returncode == 2
    assert "already holds files" in result.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def snapshot(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
    }


def test_export_of_a_foreign_run_writes_only_into_out(full_vocab_run, tmp_path):
    foreign = tmp_path / "foreign"
    shutil.copytree(full_vocab_run, foreign, symlinks=True)  # a copy: not this user's run
    before = snapshot(foreign)
    check(run_cli(f"ckpt_path={foreign}", "out=out", cwd=tmp_path, tool="gptlab-export"))
    assert snapshot(foreign) == before
    card = (tmp_path / "out" / "README.md").read_text()
    assert "not your run" in card  # its settings files were not read
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True)


def test_init_from_trains_on_from_the_folder(full_vocab_run, tmp_path):
    exported = full_vocab_run.parent / "exported"
    refused = run_main(f"init_from={exported}", "debug=fast", cwd=tmp_path)
    assert refused.returncode == 2
    assert "data.compact_vocab=false" in refused.stderr
    args = (
        f"init_from={exported}",
        "debug=fast",
        "data.compact_vocab=false",
        "trainer.max_steps=3",
    )
    check(run_main(*args, "hydra.run.dir=init", cwd=tmp_path))
    # 3 steps from the folder's weights, not from a fresh model's ln(100277) = 11.5 nats
    source = read_metrics(full_vocab_run)["best_val_loss"]
    assert read_metrics(tmp_path / "init")["best_val_loss"] < source + 0.2 < math.log(VOCAB) - 1


def test_the_readmes_lm_eval_lines_run_as_written(full_vocab_run, tmp_path, corpus_text):
    """The README's two lines, in a folder holding the export (and scripts/, as a clone does):
    scripts/next_sentence_task.py writes the task fitted to the model's window, lm_eval --model
    hf runs it offline (8 documents: --limit), no request cut to fit (lm-eval warns on each)."""
    readme = (ROOT / "README.md").read_text().splitlines()
    make, evaluate = [
        shlex.split(line, comments=True)
        for line in readme
        if line.startswith(("python scripts/next_sentence_task.py", "lm_eval "))
    ]
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    (tmp_path / "exported").symlink_to(full_vocab_run.parent / "exported")
    wrong = run_cli(*make[1:-1], "scripts", cwd=tmp_path, tool=make[0])  # --model scripts
    assert wrong.returncode == 2 and "holds no model_max_length" in wrong.stderr
    assert not (tmp_path / "tasks").exists()
    made = check(run_cli(*make[1:], cwd=tmp_path, tool=make[0]))
    assert "documents from" in made.stdout
    docs = [
        json.loads(line) for line in (tmp_path / "tasks" / f"{TASK}.jsonl").read_text().splitlines()
    ]
    assert len(docs) > 100
    squashed = " ".join(corpus_text.split())
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "exported", local_files_only=True)
    for doc in docs:  # the true choice follows its passage in the book; the others do not
        assert len(doc["choices"]) == 4
        assert f"{doc['context']} {doc['choices'][doc['label']]}" in squashed
        others = [c for i, c in enumerate(doc["choices"]) if i != doc["label"]]
        assert not any(f"{doc['context']} {c}" in squashed for c in others)
        for choice in doc["choices"]:  # lm-eval's request: at most context_length + 1 tokens
            assert len(tokenizer(f"{doc['context']} {choice}")["input_ids"]) <= 32 + 1
    args = (*evaluate[1:], "--limit", "8", "--output_path", "results")
    ran = check(run_cli(*args, cwd=tmp_path, tool=evaluate[0]))
    assert TASK in ran.stdout
    assert "exceeds model's maximum length" not in ran.stderr
    [saved] = (tmp_path / "results").rglob("results_*.json")
    result = json.loads(saved.read_text())
    assert result["n-samples"][TASK] == {"original": len(docs), "effective": 8}
    assert 0.0 <= result["results"][TASK]["acc,none"] <= 1.0


def test_import_counts_the_blocks_before_building_a_model(tmp_path):
    """A config.json asking for 1,000 blocks beside the weights of a few: refused from the
    weights file's header, in seconds, before any model of that depth is built; 10**5 blocks,
    from config.json alone (over gptlab's 1,024); a header that asks for a terabyte is not read."""
    config, model = random_model()
    out = tmp_path / "exported"
    write_folder(trained_of(config, model), model, out, "card\n")
    settings = json.loads((out / "config.json").read_text())
    key = "n_layer" if "n_layer" in settings else "num_hidden_layers"
    (out / "config.json").write_text(json.dumps({**settings, key: 1_000}))
    held = f"it holds {config.num_blocks} blocks where config.json says 1000"
    with pytest.raises(ConfigError, match=re.escape(held)):
        read_folder(out)
    (out / "config.json").write_text(json.dumps({**settings, key: 100_000}))
    with pytest.raises(ConfigError, match=f"{key}=100000, over 1024"):
        read_folder(out)
    (out / "config.json").write_text(json.dumps(settings))
    weights = out / "model.safetensors"
    weights.write_bytes((1 << 40).to_bytes(8, "little") + weights.read_bytes()[8:])  # 1 TB header
    with pytest.raises(ConfigError, match="its header says 1099511627776 bytes"):
        read_folder(out)
