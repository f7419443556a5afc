"""gptlab-generate end to end, from a real debug=fast checkpoint; the checkpoint helpers."""

from __future__ import annotations

import re
import shutil
from types import SimpleNamespace

import pytest
import torch
from helpers import check, run_main
from hydra import compose, initialize_config_module

from gptlab.cli.generate import decode_stream, run_job, sample_texts
from gptlab.data.tokenizer import Tokenizer
from gptlab.errors import ConfigError
from gptlab.reader import load_checkpoint
from gptlab.run.checkpoints import find_checkpoint, load_model

PROMPT = "The salesperson"
HEADER = re.compile(r"^--- sample \d+ of \d+ ---\n", re.MULTILINE)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One debug=fast training run, the checkpoint every test below samples from."""
    cwd = tmp_path_factory.mktemp("generate")
    check(run_main("debug=fast", f"hydra.run.dir={cwd / 'run'}", cwd=cwd))
    return cwd / "run"


def loaded(path):
    """The model and tokenizer gptlab-generate samples from."""
    model, tokenizer, step = load_model(path)
    return SimpleNamespace(model=model, tokenizer=tokenizer, step=step)


@pytest.fixture(scope="module")
def module(run_dir):
    return loaded(run_dir / "checkpoints" / "best.ckpt")


TOOL = "gptlab-generate"


def generate(*args: str, cwd):
    return run_main(*args, cwd=cwd, tool=TOOL)


def samples(stdout: str) -> list[str]:
    """The texts between the `--- sample i of n ---` lines (each ends with one added newline)."""
    first, *texts = HEADER.split(stdout)
    assert first == "", stdout
    return [t[:-1] if t.endswith("\n") else t for t in texts]


def test_samples_from_run_dir_and_file_start_with_the_prompt_and_repeat(run_dir, module, tmp_path):
    args = (f"prompt={PROMPT}", "max_new_tokens=12", "num_samples=3", "seed=3")
    paths = [run_dir, run_dir / "checkpoints" / "best.ckpt"]
    by_dir, by_file = (check(generate(f"ckpt_path={p}", *args, cwd=tmp_path)) for p in paths)
    texts = samples(by_dir.stdout)
    assert len(texts) == 3
    assert all(t.startswith(PROMPT) and len(t) > len(PROMPT) for t in texts), texts
    assert len(set(texts)) > 1  # three draws, not one repeated
    assert by_file.stdout == by_dir.stdout  # same checkpoint, same seed: same text
    assert "Traceback" not in by_dir.stderr
    # what was streamed is what the model generates in one piece, decoded at the end
    assert (
        sample_texts(module.model, module.tokenizer, PROMPT, 12, 0.8, 50, num_samples=3, seed=3)
        == texts
    )
    assert list(
        (tmp_path / "outputs" / "generate").rglob("generate.log")
    )  # the Hydra run directory


def test_greedy_text_is_the_same_with_and_without_the_kv_cache(run_dir, tmp_path):
    """debug=fast's context_length is 32: 40 new tokens slide the window."""
    args = (f"ckpt_path={run_dir}", f"prompt={PROMPT}", "max_new_tokens=40", "num_samples=1")
    args += ("temperature=0",)
    on, off = (check(generate(*args, f"kv_cache={c}", cwd=tmp_path)) for c in ("true", "false"))
    assert on.stdout == off.stdout
    assert on.stdout.startswith(PROMPT) and len(on.stdout) > len(PROMPT) + 40
    for result, state in ((on, "on"), (off, "off")):
        assert re.search(rf"KV cache {state}: 40 new tokens in .* tokens/s\)", result.stderr)


def test_sampled_text_is_the_same_with_and_without_the_kv_cache(module):
    """The same seed draws the same tokens: the cache changes no probability (beyond rounding)."""
    args = (module.model, module.tokenizer, PROMPT, 45, 0.8, 50, 2, 7)
    with_cache = sample_texts(*args, use_cache=True)
    assert with_cache == sample_texts(*args, use_cache=False)
    assert len(set(with_cache)) == 2


def test_streaming_writes_token_by_token_and_matches_generate(module):
    pieces: list[str] = []
    [text] = sample_texts(
        module.model,
        module.tokenizer,
        PROMPT,
        max_new_tokens=10,
        temperature=0.0,
        top_k=None,
        write=pieces.append,
    )
    assert len(pieces) >= 10 and "".join(pieces) == text + "\n"
    ids = torch.tensor([module.tokenizer.encode(PROMPT)])
    expected = module.tokenizer.decode(module.model.generate(ids, 10, temperature=0.0)[0].tolist())
    assert text == expected  # temperature 0: greedy
    other_seed = sample_texts(module.model, module.tokenizer, PROMPT, 12, num_samples=2, seed=1)
    assert other_seed != sample_texts(
        module.model, module.tokenizer, PROMPT, 12, num_samples=2, seed=2
    )


def test_empty_prompt_starts_from_a_newline_and_unknown_tokens_are_refused(module):
    [text] = sample_texts(module.model, module.tokenizer, "", max_new_tokens=5)
    assert text.startswith("\n") and len(text) > 1
    # the same check as gptlab-generate's (in process: a process importing Lightning costs seconds)
    with pytest.raises(ConfigError, match=r"prompt='xylophone quantum': .* compact vocabulary"):
        sample_texts(module.model, module.tokenizer, "xylophone quantum")


def test_stream_decoder_holds_back_split_characters():
    tokenizer = Tokenizer("cl100k_base")
    text = "Café 🦜🫠 naïve ꙮ 𝔘 ok"  # rare characters: several byte tokens each under cl100k_base
    ids = tokenizer.encode(text)
    assert any(
        "\ufffd" in tokenizer.decode([i]) for i in ids
    )  # some tokens are parts of a character
    pieces = list(decode_stream(tokenizer, [[i] for i in ids]))  # one token at a time
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


# case: (arguments, what the one error line must say); {bad} and {run} are filled in below.
# The entry point, argv to exit code, for a few; the rest through the tool's task function.
CLI_CASES = {
    "max_new_tokens": (["ckpt_path={run}", "max_new_tokens=0"], ["max_new_tokens"]),
    "no_ckpt_path": ([], ["ckpt_path is not set"]),
    "missing": (["ckpt_path={bad}/nowhere"], ["ckpt_path", "nowhere", "does not exist"]),
    "garbage": (
        ["ckpt_path={bad}/garbage.ckpt"],
        ["ckpt_path", "garbage.ckpt", "truncated or not a"],
    ),
    "truncated": (
        ["ckpt_path={bad}/truncated.ckpt"],
        ["ckpt_path", "truncated.ckpt", "truncated or not a"],
    ),
}
IN_PROCESS_CASES = {
    "temperature": (["ckpt_path={run}", "temperature=-0.5"], ["temperature"]),
    "top_k": (["ckpt_path={run}", "top_k=0"], ["top_k"]),
    "num_samples": (["ckpt_path={run}", "num_samples=0"], ["num_samples"]),
    "seed": (["ckpt_path={run}", "seed=-1"], ["seed"]),
    "kv_cache": (["ckpt_path={run}", "kv_cache=maybe"], ["kv_cache"]),
    "device": (["ckpt_path={run}", "device=tpu"], ["device"]),
    "empty_dir": (
        ["ckpt_path={bad}/empty_run"],
        ["ckpt_path", "empty_run", "checkpoints/best.ckpt"],
    ),
}


@pytest.fixture(scope="module")
def bad(run_dir, tmp_path_factory):
    bad = tmp_path_factory.mktemp("bad")
    (bad / "garbage.ckpt").write_bytes(b"this is not a checkpoint\x00\x01" * 100)
    data = (run_dir / "checkpoints" / "best.ckpt").read_bytes()
    (bad / "truncated.ckpt").write_bytes(data[: len(data) // 2])
    (bad / "empty_run").mkdir()
    return bad


@pytest.fixture(scope="module")
def failures(run_dir, bad):
    """The CLI cases through gptlab-generate's entry point, argv to exit code, in this process."""
    return {
        name: run_main(*[a.format(bad=bad, run=run_dir) for a in args], cwd=bad, tool=TOOL)
        for name, (args, _) in CLI_CASES.items()
    }


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_arguments_fail_with_one_clear_paragraph(failures, case):
    result, names = failures[case], CLI_CASES[case][1]
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1, result.stderr  # one paragraph
    assert all(name in errors[0] for name in names), errors[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("case", list(IN_PROCESS_CASES))
def test_bad_arguments_exit_2_naming_the_argument(run_dir, bad, case, caplog, capsys):
    args, names = IN_PROCESS_CASES[case]
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        cfg = compose("generate", overrides=[a.format(bad=bad, run=run_dir) for a in args])
    with pytest.raises(SystemExit) as exit_info:
        run_job(cfg)
    assert exit_info.value.code == 2
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert all(name in record.getMessage() for name in names) and "\n" not in record.getMessage()
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------- the checkpoint helpers
def test_find_checkpoint_prefers_best_then_last(run_dir, tmp_path):
    assert find_checkpoint(run_dir) == run_dir / "checkpoints" / "best.ckpt"
    assert find_checkpoint(str(run_dir / "checkpoints" / "last.ckpt")).name == "last.ckpt"
    (tmp_path / "checkpoints").mkdir()
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", tmp_path / "checkpoints" / "last.ckpt")
    assert find_checkpoint(tmp_path) == tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match="ckpt_path"):
        find_checkpoint(tmp_path / "nowhere")


def test_load_module_strips_the_torch_compile_prefix(run_dir, module, tmp_path):
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "best.ckpt")
    checkpoint["state_dict"] = {
        k.replace("model.", "model._orig_mod.", 1): v for k, v in checkpoint["state_dict"].items()
    }
    torch.save(checkpoint, tmp_path / "compiled.ckpt")
    model = loaded(tmp_path / "compiled.ckpt").model
    assert not model.training
    for (name, a), (_, b) in zip(
        model.state_dict().items(), module.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
