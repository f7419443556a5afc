"""A Hugging Face model folder written from a gptlab model, or read as one (docs/export.md):
config.json and model.safetensors read by gptlab.reader as data (no code), checked and bounded
like a foreign checkpoint; written only into the folder gptlab.run.place admitted."""

import tempfile
from pathlib import Path

from gptlab import files, reader
from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.model.hf import OPT_OFFSET, from_hf, to_hf
from gptlab.model.hf_config import CLASSES, hf_config, model_type, settings_of
from gptlab.run.checkpoints import MAX_BLOCKS, Trained
from gptlab.run.place import PLACE

WEIGHTS = "model.safetensors"
# config.json's whole numbers, bounded before transformers' config class reads them (it makes a
# list as long as some: one entry a layer, a label): a vocabulary, a context length at most LIMIT
LIMIT = 1 << 20
COUNTS = {"n_layer": MAX_BLOCKS, "num_hidden_layers": MAX_BLOCKS, "num_labels": MAX_BLOCKS}


def check_exportable(trained: Trained) -> None:
    """A compact vocabulary has no standard tokenizer form: refused before any work."""
    if trained.tokenizer["vocab"] is not None:
        raise ConfigError(
            "The checkpoint's vocabulary is compact (gptlab's default data.compact_vocab=true: "
            f"{len(trained.tokenizer['vocab'])} ids remapped to the tokens its corpus holds), "
            "which no standard Hugging Face tokenizer reproduces. Train with "
            "data.compact_vocab=false (the whole tiktoken vocabulary) to export."
        )
    model_type(GPTConfig(**trained.model))  # a class that holds it, or the paragraph saying why


def default_new_tokens(context_length: int) -> int:
    """generate()'s and pipeline()'s default number of new tokens: half the window, so a prompt
    of up to the other half stays inside it. A number of new tokens, not max_length (a total): a
    saved max_length makes transformers warn on every call that passes max_new_tokens, and
    without either pipeline() asks for 256, past a small model's position table."""
    return max(1, context_length // 2)


def write_folder(trained: Trained, model, out: Path, card: str) -> None:
    """config.json, model.safetensors, generation_config.json, the tokenizer and README.md of
    `model` (the GPT built from `trained`) into `out` (new or empty, admitted): written in a
    temporary folder inside it, then moved in."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from gptlab.data.hf_tokenizer import to_transformers

    check_exportable(trained)
    config = GPTConfig(**trained.model)
    tokenizer = to_transformers(trained.tokenizer["encoding"], config.context_length)
    settings = hf_config(config, tokenizer.eos_token_id)
    state = model.state_dict()
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**settings))
    hf.load_state_dict(to_hf(config, state), strict=True)
    # generate()'s and pipeline()'s defaults: half the window of new tokens, batches padded with eos
    hf.generation_config.update(
        max_new_tokens=default_new_tokens(config.context_length),
        pad_token_id=tokenizer.eos_token_id,
    )
    with tempfile.TemporaryDirectory(dir=PLACE.make_dir(out), prefix=".export-") as staging:
        hf.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        Path(staging, "README.md").write_text(card)
        for written in Path(staging).iterdir():  # transformers' files as gptlab's: the umask
            written.chmod(0o666 & ~files.umask())
        PLACE.move_in(Path(staging), out)


def not_readable(path: Path, what: str) -> ConfigError:
    names = ", ".join(name for name, _ in CLASSES.values())
    return ConfigError(
        f"init_from: '{path}' is not a Hugging Face model folder gptlab can train on ({what}). "
        f"Give a folder of one of {names}, such as one gptlab-export wrote."
    )


def numbers(data, key: str = "") -> list[tuple[str, int]]:
    """Every whole number in config.json's data (at most 32 deep: gptlab.reader), by its key."""
    if isinstance(data, dict):
        return [found for k, value in data.items() for found in numbers(value, str(k))]
    if isinstance(data, list):
        return [found for value in data for found in numbers(value, key)]
    return [(key, data)] if isinstance(data, int) else []


def checked_config(path: Path, hf) -> tuple[str, GPTConfig]:
    """(model_type, the GPTConfig) of the folder's config.json, read as data: a class gptlab
    reads, no code (auto_map), every setting gptlab does not compute refused by name."""
    from transformers import AutoConfig

    if not isinstance(hf, dict) or "auto_map" in hf:
        raise not_readable(path, "no config.json of a model_type gptlab reads, without code")
    if hf.get("model_type") not in CLASSES:
        kind = hf.get("model_type")  # a foreign file's: shown at most 80 characters long
        found = "no model_type" if kind is None else f"model_type {str(kind)[:80]!r}"
        raise not_readable(path, f"config.json names {found}, which gptlab does not read")
    for key, value in numbers(hf):
        if value > COUNTS.get(key, LIMIT):
            raise not_readable(
                path, f"config.json sets {key}={value}, over {COUNTS.get(key, LIMIT)}"
            )
    try:
        settings, differ, (key, width) = settings_of(AutoConfig.for_model(**hf))
    except Exception as e:  # whatever the config class says of a foreign file: bad input
        raise not_readable(path, f"config.json does not read ({type(e).__name__})") from None
    if differ:
        raise not_readable(path, "config.json sets " + "; ".join(differ))
    try:
        config = GPTConfig(**settings, dropout=0.0)
    except (ConfigError, TypeError) as e:
        raise not_readable(path, f"its settings give no gptlab model: {e}") from None
    if config.ffn_hidden != width:
        raise not_readable(path, f"config.json sets {key}={width}, which no model.ffn_mult gives")
    return hf["model_type"], config


def encoding_of(path: Path, saved, vocab_size: int) -> str:
    """The tiktoken encoding whose vocabulary the folder's tokenizer.json holds, id for id."""
    import tiktoken

    from gptlab.data.hf_tokenizer import vocab_of
    from gptlab.data.tokenizer import load_encoding

    vocab = saved.get("model", {}).get("vocab") if isinstance(saved, dict) else None
    listed = saved.get("added_tokens", []) if isinstance(saved, dict) else []
    added = {t.get("content"): t.get("id") for t in listed if isinstance(t, dict)}
    absent = []
    for name in tiktoken.list_encoding_names():
        try:
            size = load_encoding(name, offline=True).max_token_value + 1
        except ConfigError:  # not cached here: not this one
            absent.append(name)
            continue
        if size == vocab_size and isinstance(vocab, dict) and {**vocab, **added} == vocab_of(name):
            return name
    raise not_readable(
        path,
        f"its tokenizer.json is not a tiktoken encoding's with {vocab_size} ids; not cached "
        f"here: {', '.join(absent) or 'none'} (GPT-2's is r50k_base: docs/export.md)",
    )


def check_data(path: Path, encoding: str, context_length: int, data) -> None:
    """The run's data reads text as the folder's tokenizer does, in windows its model takes."""
    if data.compact_vocab or data.encoding != encoding:
        raise ConfigError(
            f"init_from: '{path}' reads text with tiktoken's {encoding}, the whole vocabulary; "
            f"train on it with data.encoding={encoding} data.compact_vocab=false."
        )
    if data.context_length > context_length:
        raise ConfigError(
            f"data.context_length={data.context_length}: the model of init_from '{path}' reads "
            f"at most {context_length} tokens; give data.context_length={context_length} or less."
        )


def check_sizes(path: Path, kind: str, config: GPTConfig, hf_state: dict) -> None:
    """config.json's sizes against the tables the weights hold, before anything is made from
    them (a sinusoidal table to compare with, a model): the token table's rows and width, a
    learned position table's rows (OPT's two more); a rotary model's length is bounded where
    its model is (GPT.bounded)."""
    shapes = {name.split(".")[-2]: tuple(t.shape) for name, t in hf_state.items() if "." in name}
    tokens = shapes.get("wte", shapes.get("embed_tokens"))
    if tokens != (config.vocab_size, config.d_model):
        sizes = f"vocab_size {config.vocab_size} and hidden size {config.d_model}"
        raise not_readable(path, f"config.json says {sizes}, its token table is {tokens}")
    positions = shapes.get("wpe", shapes.get("embed_positions"))
    rows = config.context_length + (OPT_OFFSET if kind == "opt" else 0)
    if kind in ("gpt2", "opt") and positions != (rows, config.d_model):
        where = f"config.json says {config.context_length} positions, its table is {positions}"
        raise not_readable(path, where)


def read_folder(path: str | Path, data=None) -> Trained:
    """A Hugging Face folder (init_from) as a checkpoint's parts, read as data: its config.json
    checked, its tokenizer a tiktoken encoding's, both against a run's `data` settings, its
    weights' header counted before they are read, then its weights as gptlab's (their names and
    shapes against the model: build_gpt, where a run builds it), step 0."""
    folder = Path(path).expanduser()
    hf = reader.read_json(folder / "config.json")
    kind, config = checked_config(folder, hf)  # before the tokenizer: refused on config.json
    tokenizer = folder / "tokenizer.json"
    saved = reader.read_json(tokenizer, reader.MAX_TOKENIZER, reader.MAX_TOKENIZER_NODES)
    encoding = encoding_of(folder, saved, config.vocab_size)
    if data is not None:
        check_data(folder, encoding, config.context_length, data)
    try:
        hf_state = reader.load_safetensors(folder / WEIGHTS, config.num_blocks)
    except (OSError, ValueError) as e:  # and safetensors' own errors, a damaged file's
        raise not_readable(folder, f"{WEIGHTS}: {e}") from None
    check_sizes(folder, kind, config, hf_state)
    try:
        settings, state = from_hf(kind, config, hf_state)
    except (KeyError, RuntimeError) as e:  # a tensor missing, or of a shape that does not fit
        raise not_readable(folder, f"{WEIGHTS} does not hold its model's weights ({e})") from None
    return Trained(settings, {"encoding": encoding, "vocab": None}, state, 0)
