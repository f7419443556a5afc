"""init_from (docs/export.md): a folder transformers saved, of a class gptlab reads, is computed as
transformers computes it, every config.json field that changes the computation carried into
gptlab's model or refused by name, and the GPT-2 layout (gelu_new, tied) trains on the book."""

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="needs the export extra: pip install -e '.[export]'")

import torch  # noqa: E402
from helpers import check, read_metrics, run_main  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from gptlab.data.hf_tokenizer import to_transformers  # noqa: E402
from gptlab.data.tokenizer import Tokenizer  # noqa: E402
from gptlab.errors import ConfigError  # noqa: E402
from gptlab.model.config import GPTConfig  # noqa: E402
from gptlab.model.gpt import GPT  # noqa: E402
from gptlab.model.hf_config import CLASSES, FIELDS  # noqa: E402
from gptlab.run.checkpoints import read_trained  # noqa: E402
from gptlab.run.directory import last_checkpoint  # noqa: E402
from gptlab.run.hf_folder import read_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENCODING = "cl100k_base"  # on this machine; GPT-2's own r50k_base is not (docs/export.md)
VOCAB = 100277
SMALL = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
SMALL.update(max_position_embeddings=64)
SWIGLU = round(2 * 4 * 64 / 3)  # gptlab's SwiGLU width at ffn_mult 4: 171
MODELS = {  # transformers' configs at their defaults but for the sizes -> what gptlab carries
    "gpt2": (
        dict(model_type="gpt2", **SMALL),
        dict(activation="gelu_new", tie_weights=True, positional="learned", norm_eps=None),
    ),
    "llama": (
        dict(model_type="llama", **SMALL, intermediate_size=SWIGLU, rms_norm_eps=1e-6),
        dict(activation="swiglu", norm_eps=1e-6, rope_theta=10000.0),
    ),
    "llama rope_theta=5e5": (
        dict(model_type="llama", **SMALL, intermediate_size=SWIGLU, rope_theta=5e5),
        dict(rope_theta=5e5, norm_eps=1e-6),
    ),
    "qwen3": (
        dict(
            model_type="qwen3",
            **SMALL,
            intermediate_size=SWIGLU,
            head_dim=16,
            num_key_value_heads=4,
        ),
        dict(qk_norm=True, norm_eps=1e-6),  # its q_norm and k_norm's eps too
    ),
    "opt pre-LN": (dict(model_type="opt", **SMALL, ffn_dim=256), dict(norm="pre")),
}
HUB = "gpt2 as the Hub stores it"  # GPT2Model's names (h.0..., no transformer.), no lm_head
MODELS[HUB] = MODELS["gpt2"]


def save_folder(out, settings: dict, perturb: bool = True, base: bool = False) -> None:
    """A model transformers builds from `settings`, its weights random (perturbed: every one
    matters, no unit gains or zero biases), saved with save_pretrained (`base`: its base model,
    as the Hub's GPT-2) beside cl100k's tokenizer."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**settings)).eval()
    if perturb:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    (model.base_model if base else model).save_pretrained(out)
    to_transformers(ENCODING, 64).save_pretrained(out)


@pytest.fixture(scope="module")
def val_ids(corpus_text) -> torch.Tensor:
    """Two windows of 64 val tokens (the last tenth of the book), as gptlab encodes them."""
    ids = Tokenizer(ENCODING).encode(corpus_text)
    return torch.tensor(ids[int(len(ids) * 0.9) :][:128]).view(2, 64)


def test_every_field_of_each_class_is_carried_fixed_or_irrelevant():
    """model.hf_config.FIELDS rules on each field of the installed transformers' config classes; a
    field a later version adds is refused as unknown until it is ruled on."""
    for kind in CLASSES:
        fields = {f.name for f in dataclasses.fields(AutoConfig.for_model(kind))}
        assert fields <= set(FIELDS), (kind, fields - set(FIELDS))


@pytest.mark.parametrize("name", MODELS)
def test_gptlab_computes_the_log_probs_transformers_does(name, tmp_path, val_ids):
    settings, carried = MODELS[name]
    save_folder(tmp_path, settings, base=name == HUB)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    trained = read_folder(tmp_path)
    assert {key: trained.model[key] for key in carried} == carried
    model = GPT(GPTConfig(**trained.model)).eval()
    model.load_state_dict({k.removeprefix("model."): v for k, v in trained.weights.items()})
    with torch.no_grad():
        ours = torch.log_softmax(model(val_ids), dim=-1)
        theirs = torch.log_softmax(hf(val_ids).logits, dim=-1)
    assert (ours - theirs).abs().max().item() <= 1e-4


REFUSED = [  # (model, a change to its config.json, what the paragraph names)
    ("gpt2", dict(scale_attn_weights=False), "scale_attn_weights=False (gptlab computes True)"),
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True"),
    ("gpt2", dict(add_cross_attention=True), "add_cross_attention=True"),
    ("gpt2", dict(activation_function="tanh"), "activation_function='tanh' (gptlab computes one"),
    ("gpt2", dict(n_inner=100), "n_inner=100, which no model.ffn_mult gives"),
    ("opt", dict(do_layer_norm_before=True, word_embed_proj_dim=32), "word_embed_proj_dim=32"),
    ("opt", dict(enable_bias=False), "enable_bias=False"),
    ("llama", dict(num_key_value_heads=2), "num_key_value_heads=2 (gptlab computes 4)"),
    ("llama", dict(head_dim=32), "head_dim=32 (gptlab computes 16)"),
    ("llama", dict(attention_bias=True), "attention_bias=True (gptlab computes False)"),
    ("llama", dict(hidden_act="gelu"), "hidden_act='gelu' (gptlab computes one of silu)"),
    ("llama", dict(rope_scaling=dict(rope_type="linear", factor=2.0)), "'factor': 2.0"),
    ("llama", dict(partial_rotary_factor=0.5), "'partial_rotary_factor': 0.5"),
    ("qwen3", dict(use_sliding_window=True), "use_sliding_window=True"),
    ("apertus", {}, "hidden_act='xielu'"),
    (
        "gpt2",
        dict(auto_map={"AutoModelForCausalLM": "x.Y"}),
        "without code",
    ),  # and its llama3 rope: transformers' defaults
    # sizes bounded before transformers' config class makes a list of them (issue #56)
    ("gpt2", dict(n_layer=10**9), "n_layer=1000000000, over 1024"),
    ("gpt2", dict(num_labels=10**9), "num_labels=1000000000, over 1024"),
    ("qwen3", dict(layer_types=["full_attention"]), "config.json does not read"),
    # a class gptlab does not read: the refusal names the model_type found
    ("mistral", {}, "config.json names model_type 'mistral', which gptlab does not read"),
    ("qwen2", {}, "config.json names model_type 'qwen2', which gptlab does not read"),
]


@pytest.mark.parametrize(("kind", "change", "named"), REFUSED)
def test_a_field_gptlab_does_not_compute_is_refused_by_name(kind, change, named, tmp_path):
    """Refused from config.json alone: a folder of nothing else (no tokenizer, no weights) gets
    config.json's paragraph, not one about a missing file."""
    (tmp_path / "config.json").write_text(json.dumps(dict(model_type=kind, **SMALL, **change)))
    with pytest.raises(ConfigError) as refused:
        read_folder(tmp_path)
    assert named in str(refused.value)


def docs_example(title: str) -> str:
    """The python block of docs/export.md's section `title`."""
    text = (ROOT / "docs" / "export.md").read_text()
    section = text[text.index(title) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_a_gpt2_folder_trains_on_the_book(tmp_path, monkeypatch):
    """nanoGPT's init_from=gpt2, then fine-tune: GPT2LMHeadModel's own layout (gelu_new, tied
    embeddings, learned positions) as transformers initialises it (docs/export.md's example, run
    as written), then gptlab-train. Its biases are all zero, and still biases that train: the
    architecture is the config's and the tensors', never their values."""
    monkeypatch.chdir(tmp_path)
    exec(docs_example("### GPT-2: nanoGPT's"), {})  # writes gpt2-small
    folder = tmp_path / "gpt2-small"
    written = load_file(folder / "model.safetensors")
    biases = [key for key in written if key.endswith(".bias")]
    assert len(biases) == 2 * 6 + 1 and not any(written[key].any() for key in biases)
    assert read_folder(folder).model["bias"] is True
    args = (f"init_from={folder}", "debug=fast", "data.compact_vocab=false")
    args += ("trainer.max_steps=20",)
    check(run_main(*args, "hydra.run.dir=tuned", cwd=tmp_path))
    tuned = read_trained(last_checkpoint(tmp_path / "tuned"))
    model = tuned.model
    assert model["activation"] == "gelu_new" and model["tie_weights"] and model["bias"]
    assert (model["d_model"], model["num_blocks"], model["norm"]) == (64, 2, "pre")
    assert read_metrics(tmp_path / "tuned")["best_val_loss"] < math.log(VOCAB) - 1
    trained = [key for key in tuned.weights if key.endswith(".bias")]
    assert len(trained) == len(biases) and all(tuned.weights[key].any() for key in trained)

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "scale_attn_weights": False}))
    refused = run_main(*args, "hydra.run.dir=refused", cwd=tmp_path)
    assert refused.returncode == 2
    assert "scale_attn_weights=False" in refused.stderr


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A folder of each class whose sizes a config.json could overstate, saved once."""
    out = tmp_path_factory.mktemp("folders")
    for kind in ("gpt2", "opt pre-LN", "llama"):
        save_folder(out / kind, MODELS[kind][0], perturb=False)
    return out


def test_zero_biases_from_initialisation_are_biases(folders):
    """GPT-2's and OPT's layers always hold biases, which transformers initialises to zero: read
    as biases (`bias=true`, every one kept), not as a model without them."""
    for kind in ("gpt2", "opt pre-LN"):
        written = load_file(folders / kind / "model.safetensors")
        assert not any(t.any() for key, t in written.items() if key.endswith(".bias"))
        trained = read_folder(folders / kind)
        assert trained.model["bias"] is True, kind
        kept = [key for key in trained.weights if key.endswith(".bias")]
        assert len(kept) == 2 * 6 + 1  # each block's norms, attention, FFN; the final norm


def oversized(folders, kind: str, out, **change):
    """A copy of the `kind` folder whose config.json says `change`."""
    shutil.copytree(folders / kind, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **change}))
    return out


@pytest.mark.parametrize(
    ("kind", "change", "named"),
    [
        ("gpt2", dict(n_positions=2**20), "1048576 positions, its table is (64, 64)"),
        ("gpt2", dict(n_embd=2**20, n_head=1), "its token table is (100277, 64)"),
        ("opt pre-LN", dict(max_position_embeddings=2**20), "its table is (66, 64)"),
    ],
)
def test_config_json_sizes_are_bounded_by_the_weights_before_any_table(
    folders, kind, change, named, tmp_path
):
    """A config.json asking for a table far larger than its weights (2^20 positions: a 256 MB
    sinusoidal table to compare the learned one with) is refused against the tables the weights
    file holds, before anything is made from it."""
    with pytest.raises(ConfigError) as refused:
        read_folder(oversized(folders, kind, tmp_path / "folder", **change))
    assert named in str(refused.value)


@pytest.mark.parametrize(
    ("kind", "key"), [("gpt2", "n_positions"), ("llama", "max_position_embeddings")]
)
def test_10_9_positions_are_refused_from_config_json_alone(folders, kind, key, tmp_path):
    """The issue's config.json: 10^9 positions (a 64 GB table once allocated before any bound),
    over what gptlab reads of any size, refused before transformers' config class reads it."""
    with pytest.raises(ConfigError, match=f"{key}=1000000000, over 1048576"):
        read_folder(oversized(folders, kind, tmp_path / "folder", **{key: 10**9}))
