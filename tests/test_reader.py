"""The reader (gptlab.reader): every foreign file is bounded before anything is allocated for
what it says. Crafted checkpoints, safetensors and run files, each run through a tool as a
process of its own, refused within 30 CPU seconds with one paragraph, its peak memory under 1 GB;
JSON and YAML read under a budget of values and depth."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import BIN

from gptlab import reader
from gptlab.errors import ConfigError

GB = 1 << 30


def measured(tool: str, *args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, int, float]:
    """`tool args` as a process of its own: its result, peak memory in bytes, CPU seconds (what
    it did, whatever else loads the machine: wall time is the benchmark's)."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stderr.write(r.stderr)\n"
        "used = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(used.ru_maxrss * 1024, used.ru_utime + used.ru_stime)\n"
        "sys.exit(r.returncode)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", wrapper, str(BIN / tool), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,  # a hang ends here
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    peak, cpu = result.stdout.split()[-2:]
    return result, int(peak), float(cpu)


def crafted(finished: Path, path: Path, change) -> Path:
    checkpoint = torch.load(finished / "checkpoints" / "best.ckpt", weights_only=True)
    change(checkpoint)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # pickle recurses into settings nested 5,000 deep
    try:
        torch.save(checkpoint, path)
    finally:
        sys.setrecursionlimit(limit)
    return path


def stride_zero(size: int):
    """The embedding as a view of one number: 2 KB in the file, size x size to whoever uses it."""

    def change(checkpoint):
        checkpoint["state_dict"]["model.token_embedding.weight"] = torch.zeros(1).expand(size, size)
        checkpoint["hyper_parameters"]["model"].update(vocab_size=size, d_model=size, num_heads=1)

    return change


def zero_blocks(checkpoint) -> None:
    """20,000 blocks, each named by a tensor of no size, and settings that agree."""
    for i in range(20_000):
        checkpoint["state_dict"][f"model.blocks.{i}.ln1.weight"] = torch.zeros(0)
    checkpoint["hyper_parameters"]["model"].update(num_blocks=20_000)


def one_storage(checkpoint) -> None:
    """The issue's: each of a 120-block model's ~1,450 weights a view of one storage (as large
    as the largest): 7.9 MB on disk, a 1.5 GB model to whoever builds it."""
    from gptlab.model.config import GPTConfig
    from gptlab.model.gpt import GPT

    model = checkpoint["hyper_parameters"]["model"]
    model.update(num_blocks=120, d_model=512, num_heads=8)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in GPT(GPTConfig(**model)).state_dict().items()}
    storage = torch.zeros(max(shape.numel() for shape in shapes.values()))
    checkpoint["state_dict"] = {
        f"model.{k}": storage[: shape.numel()].view(shape) for k, shape in shapes.items()
    }


def overlapping(checkpoint) -> None:
    """Two weights of different shapes over the same bytes (no name repeated)."""
    state = checkpoint["state_dict"]
    up, down = state["model.blocks.0.ffn.up.weight"], state["model.blocks.0.ffn.down.weight"]
    state["model.blocks.0.ffn.down.weight"] = up.view(-1)[: down.numel()].view(down.shape)


def not_strided(make):
    def change(checkpoint):
        name = "model.blocks.0.ln1.bias"
        checkpoint["state_dict"][name] = make(checkpoint["state_dict"][name])

    return change


def nested_settings(checkpoint) -> None:
    """Settings 5,000 deep: anything that recursed through them (a repr) failed mid-way."""
    deep = {}
    for _ in range(5_000):
        deep = {"a": deep}
    checkpoint["hyper_parameters"]["model"]["d_model"] = deep


def holding_itself(checkpoint) -> None:
    """A list that holds itself: anything that recursed through it would never end."""
    loop = []
    loop.append(loop)
    checkpoint["hyper_parameters"]["loop"] = loop


def settings(**values):
    return lambda checkpoint: checkpoint["hyper_parameters"]["model"].update(values)


def zip_bomb(path: Path) -> Path:
    """A zip whose one member deflates 256 KB into 256 MB: torch.save never compresses."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("archive/data.pkl", "w", force_zip64=True) as member:
            for _ in range(256):
                member.write(bytes(1 << 20))
    return path


BOMBS = {
    "stride-0 32768": stride_zero(32768),
    "stride-0 98304": stride_zero(98304),
    "20,000 zero-size blocks": zero_blocks,
    "num_blocks": settings(num_blocks=100_000),
    "context_length": settings(context_length=10**7),
    "d_model": settings(d_model=2**20, num_heads=1),
    "vocab_size": settings(vocab_size=10**9),
    "step": lambda checkpoint: checkpoint.update(global_step=2**80),
    "1,450 views of one storage": one_storage,
    "overlapping weights": overlapping,
    "sparse": not_strided(lambda t: t.to_sparse()),
    "nested": not_strided(lambda t: torch.nested.nested_tensor([t, t[:3]])),
    "settings 5,000 deep": nested_settings,
    "a list holding itself": holding_itself,
}


# The peak is this process's own (VmHWM): getrusage's ru_maxrss would count the resident set of
# the pytest worker it was forked from (Linux carries it across exec).
REFUSE_EACH = """
import json, sys, time
from pathlib import Path
from gptlab.errors import ConfigError
from gptlab.run.checkpoints import load_model
seconds = {}
for path in sys.argv[1:]:
    start = time.process_time()
    try:
        load_model(path)
    except ConfigError as e:  # the CPU seconds, the message, the peak so far
        status = Path("/proc/self/status").read_text().splitlines()
        peak = next(int(x.split()[1]) << 10 for x in status if x.startswith("VmHWM:"))
        seconds[path] = (time.process_time() - start, str(e), peak)
print(json.dumps(seconds))
"""


def test_checkpoints_that_ask_for_too_much_are_refused_quickly_and_small(finished, tmp_path):
    """Each crafted checkpoint through the checkpoint reader of every tool (load_model), one
    process for them all: each refused with one paragraph within seconds of CPU time, the
    process's peak memory (all of them together) under 1 GB."""
    paths = [
        crafted(finished, tmp_path / f"{i}.ckpt", bomb) for i, bomb in enumerate(BOMBS.values())
    ]
    paths.append(zip_bomb(tmp_path / "zip.ckpt"))
    result = subprocess.run([sys.executable, "-c", REFUSE_EACH, *map(str, paths)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    refused = json.loads(result.stdout.splitlines()[-1])
    assert sorted(refused) == sorted(map(str, paths)), result.stdout
    for path, (cpu, message, _) in refused.items():
        assert cpu < 30 and "\n" not in message and "weights_only=False" not in message, path
    named = {name: refused[str(path)][1] for name, path in zip(BOMBS, paths, strict=False)}
    assert "weights are one" in named["1,450 views of one storage"], named
    assert "overlaps another" in named["overlapping weights"], named
    assert "not a plain dense array" in named["sparse"] and "plain" in named["nested"], named
    assert "nested more than 32 deep" in named["settings 5,000 deep"], named
    assert "hold themselves" in named["a list holding itself"], named
    peaks = {Path(path).name: peak >> 20 for path, (*_, peak) in refused.items()}  # MiB
    assert max(peaks.values()) < GB >> 20, peaks


@pytest.mark.parametrize(
    ("tool", "bomb"), [("gptlab-generate", "stride-0 98304"), ("gptlab-eval", "zip")]
)
def test_a_tool_refuses_a_crafted_checkpoint_in_one_paragraph(finished, tmp_path, tool, bomb):
    if bomb == "zip":
        path = zip_bomb(tmp_path / "bomb.ckpt")
    else:
        path = crafted(finished, tmp_path / "bomb.ckpt", BOMBS[bomb])
    result, peak, cpu = measured(tool, f"ckpt_path={path}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "weights_only=False" not in result.stderr
    assert peak < GB and cpu < 30, (peak, cpu)


def test_training_on_from_a_stride_zero_checkpoint_is_refused_too(finished, tmp_path):
    path = crafted(finished, tmp_path / "bomb.ckpt", stride_zero(32768))
    args = [f"ckpt_path={path}", "debug=fast", "hydra.run.dir=run"]
    result, peak, cpu = measured("gptlab-train", *args, cwd=tmp_path)
    assert result.returncode == 2 and "not a dense array" in result.stderr, result.stderr[-2000:]
    assert peak < GB and cpu < 30 and not (tmp_path / "run").exists()


def evil_pickle(marker: Path) -> dict:
    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    return {"state_dict": {}, "x": Evil()}


def test_a_checkpoint_holding_objects_or_bad_settings_is_refused_clearly(finished, tmp_path):
    marker = tmp_path / "PWNED"
    torch.save(evil_pickle(marker), tmp_path / "pickled.ckpt")
    crafted(finished, tmp_path / "unknown.ckpt", settings(_target_="os.system"))
    crafted(finished, tmp_path / "typed.ckpt", settings(d_model="64"))
    cases = {"pickled": "never unpickles", "unknown": "does not hold", "typed": "does not hold"}
    for name, phrase in cases.items():
        with pytest.raises(ConfigError, match=phrase):
            from gptlab.run.checkpoints import load_model

            load_model(tmp_path / f"{name}.ckpt")
    assert not marker.exists()


# ------------------------------------------------------------------ a run's JSON and YAML


def test_run_files_that_hang_nest_or_swell_are_read_as_nothing(tmp_path):
    """A FIFO (reading it would wait forever), JSON nested 100,000 deep, a YAML alias bomb, a
    file over the bound, a link: each read as nothing, at once (CPU seconds: not the load's)."""
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    laughs = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for p, n in zip("abcdefgh", "bcdefghi", strict=True):
        laughs.append(f"{n}: &{n} [" + ", ".join([f"*{p}"] * 9) + "]")
    (tmp_path / "laughs.yaml").write_text("\n".join(laughs) + "\n")
    (tmp_path / "big.yaml").write_text("k: " + "x" * (reader.MAX_TEXT + 1))
    (tmp_path / "plain.json").write_text('{"a": 1}')
    (tmp_path / "link.json").symlink_to(tmp_path / "plain.json")
    start = time.process_time()
    assert reader.read_json(tmp_path / "fifo.json") is None
    assert reader.read_json(tmp_path / "deep.json") is None
    assert reader.read_yaml(tmp_path / "laughs.yaml") is None
    assert reader.read_yaml(tmp_path / "big.yaml") is None
    assert reader.read_json(tmp_path / "link.json") is None
    assert reader.read_json(tmp_path / "plain.json") == {"a": 1}
    assert time.process_time() - start < 5


def test_json_and_yaml_are_read_under_a_budget_of_values(tmp_path):
    """One value over the budget (empty lists: the most values in the fewest bytes), read as
    nothing before anything is built; at the budget, read. JSON's values are counted in its
    bytes, YAML's in libyaml's events."""
    n = reader.MAX_NODES
    (tmp_path / "over.json").write_text("[" + ",".join(["[]"] * n) + "]")
    (tmp_path / "at.json").write_text("[" + ",".join(["0"] * (n - 1)) + "]")
    (tmp_path / "over.yaml").write_text("- []\n" * n)
    (tmp_path / "at.yaml").write_text("- []\n" * (n - 1))
    (tmp_path / "deep.yaml").write_text("[" * 5_000 + "]" * 5_000)
    assert reader.read_json(tmp_path / "over.json") is None
    assert reader.read_json(tmp_path / "at.json") == [0] * (n - 1)
    assert reader.read_yaml(tmp_path / "over.yaml") is None
    assert reader.read_yaml(tmp_path / "at.yaml") == [[]] * (n - 1)
    assert reader.read_yaml(tmp_path / "deep.yaml") is None


def test_a_tokenizer_json_of_empty_objects_costs_little(tmp_path):
    """The issue's 60 MB tokenizer.json of empty objects (20 million of them: 73 s and 3.67 GB
    to parse) is read as nothing from its bytes alone: the allocations at their peak little
    more than the bytes read, within a few CPU seconds."""
    import tracemalloc

    path = tmp_path / "tokenizer.json"
    path.write_bytes(b"[" + b"{}," * (20 << 20) + b"{}]")
    start = time.process_time()
    tracemalloc.start()
    try:
        assert reader.read_json(path, reader.MAX_TOKENIZER, reader.MAX_TOKENIZER_NODES) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < path.stat().st_size + (16 << 20), peak
    assert time.process_time() - start < 10


@pytest.mark.parametrize(
    "swollen",
    [
        "\n".join(f"k{i}: [{', '.join(['1'] * 64)}]" for i in range(80_000)),  # 16 MB
        "- []\n" * ((reader.MAX_TEXT - 1) // 5),  # under 8 MiB: 1.7 million empty lists
    ],
    ids=["16 MB", "8 MiB of empty lists"],
)
def test_a_swollen_yaml_in_someone_elses_sweep_costs_the_report_little(finished, tmp_path, swollen):
    """The issues' examples: a 16 MB config.yaml in a job of a sweep that is not the user's, and
    one just under the bound on bytes, of empty lists (84 s and 2 GB when it was parsed)."""
    sweep = tmp_path / "sweep"
    for job in ("0", "1"):
        shutil.copytree(finished, sweep / job)
    (sweep / "0" / ".hydra" / "config.yaml").write_text(swollen)
    result, peak, cpu = measured("gptlab-report", str(sweep), cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    assert peak < GB and cpu < 30, (peak, cpu)
    assert not (sweep / "summary.md").exists()  # someone else's: written elsewhere
    assert list((tmp_path / "outputs" / "sweep_report").rglob("summary.md"))
