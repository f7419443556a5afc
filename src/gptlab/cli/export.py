"""gptlab-export (usage: conf/export.yaml): a checkpoint as a Hugging Face model folder that
transformers loads with its Auto classes, offline, without remote code (docs/export.md)."""

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from gptlab import reader
from gptlab.cli.app import run_hydra_app, run_task
from gptlab.cli.eval import run_settings
from gptlab.cli.eval_record import own_run_of
from gptlab.config.schemas import register_configs
from gptlab.errors import ConfigError
from gptlab.run import directory
from gptlab.run.directory import latest_overrides
from gptlab.run.place import PLACE

log = logging.getLogger("gptlab.export")
register_configs()  # the unique_dir resolver of the output directory


def model_card(checkpoint: Path, step: int, settings: dict) -> str:
    """README.md: what the model is and how it was made, from an own run's records only."""
    run_dir = own_run_of(checkpoint)
    data, _ = run_settings(run_dir)
    corpus = data.get("path") or data.get("url") or data.get("name") or "unknown (not your run)"
    metrics = reader.read_json(directory.metrics_file(run_dir)) if run_dir else None
    metrics = metrics if isinstance(metrics, dict) else {}
    command = ["gptlab-train", *latest_overrides(run_dir)] if run_dir else None
    from gptlab.run.hf_folder import default_new_tokens

    lines = [
        "---",
        "library_name: transformers",
        "---",
        f"# A gptlab model: {settings['model_type']}",
        "",
        f"Exported by gptlab-export from `{checkpoint}` (step {step}).",
        "",
        f"- corpus: {corpus}",
        f"- steps: {step}",
        f"- best val loss: {metrics.get('best_val_loss', 'not recorded (not your run)')}",
        f"- trained with: `{' '.join(map(str, command)) if command else 'not recorded'}`",
        f"- architecture: d_model {settings['d_model']}, num_blocks {settings['num_blocks']}, "
        f"num_heads {settings['num_heads']}, context_length {settings['context_length']}",
        "",
        "Load it offline: `AutoModelForCausalLM.from_pretrained(<this folder>)` and "
        "`AutoTokenizer.from_pretrained(<this folder>)` (no remote code).",
        "",
        f"It reads at most {settings['context_length']} tokens: transformers' `generate()` and "
        f"`pipeline()` add {default_new_tokens(settings['context_length'])} new tokens by "
        "default (generation_config.json's max_new_tokens, half the window); pass "
        "`max_new_tokens` so that prompt and new tokens stay within it (past it is past what it "
        "was trained on). `gptlab-generate` goes on past it with a sliding window: each new "
        "token from the last context_length tokens.",
        "",
        "A special token's string in the text (`<|endoftext|>`, ...) is encoded as plain text, "
        "as gptlab trained on it (tokenizer_config.json's split_special_tokens).",
    ]
    return "\n".join(lines) + "\n"


def export(cfg: DictConfig) -> Path:
    """Check the arguments, read the checkpoint's tensors and checked settings, write `out`."""
    if not cfg.out or not str(cfg.out).strip():
        raise ConfigError("out is not set. Give the folder to write, e.g. out=exported.")
    from gptlab.model.config import GPTConfig
    from gptlab.model.hf_config import CLASSES, model_type
    from gptlab.model.meta import build_gpt
    from gptlab.run.checkpoints import find_checkpoint, read_trained
    from gptlab.run.hf_folder import check_exportable, write_folder

    checkpoint = Path(find_checkpoint(cfg.ckpt_path).absolute())
    out = PLACE.admit(str(cfg.out), "out")  # new or empty, in no one else's run: never overwritten
    trained = read_trained(checkpoint)
    check_exportable(trained)
    config = GPTConfig(**trained.model)
    model = build_gpt(config, trained.weights, f"ckpt_path: '{checkpoint}'")
    name = CLASSES[model_type(config)][0]
    card = model_card(checkpoint, trained.step, {**trained.model, "model_type": name})
    write_folder(trained, model, out, card)
    print(f"Exported {checkpoint} (step {trained.step}) as {name} to {out}", flush=True)
    return out


@hydra.main(version_base="1.3", config_path="pkg://gptlab.conf", config_name="export")
def run_job(cfg: DictConfig) -> Path:  # tests pass it a composed cfg
    return run_task(export, cfg, log)


def main() -> None:  # the console script gptlab-export
    run_hydra_app(run_job, "gptlab-export")


if __name__ == "__main__":
    main()
