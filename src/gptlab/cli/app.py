"""What every command-line tool shares: the exit-code protocol (gptlab.exits) around Hydra, and
the device it runs on.

Bad input ends in one paragraph and exit code 2. Hydra ends a command line it cannot compose
(unknown key or option, wrong type) with exit code 1; `run_hydra_app` composes the command line
itself first, so it knows whether an exit 1 is Hydra's (then 2) or the task's own (kept)."""

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from gptlab.errors import ConfigError
from gptlab.exits import BAD_INPUT, FAILED


def run_task(task: Callable[[DictConfig], Any], cfg: DictConfig, log: logging.Logger) -> Any:
    """Run a tool's Hydra task; a ConfigError ends it with its paragraph and exit code 2."""
    try:
        return task(cfg)
    except ConfigError as e:
        log.error("%s", e)
        sys.exit(BAD_INPUT)


def hydra_arguments(argv: list[str]) -> argparse.Namespace | None:
    """The parts of a Hydra command line that decide its config (Hydra's own flags); None when
    Hydra will only print (--help, --cfg, --info, ...) and so builds nothing."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("overrides", nargs="*")
    for flag in ("--help", "-h", "--hydra-help", "--version", "--resolve", "--run", "-r"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--multirun", "-m", action="store_true")
    parser.add_argument("--shell-completion", "-sc", action="store_true")
    for flags in (("--cfg", "-c"), ("--package", "-p"), ("--config-path", "-cp")):
        parser.add_argument(*flags)
    for flags in (("--config-name", "-cn"), ("--config-dir", "-cd"), ("--experimental-rerun",)):
        parser.add_argument(*flags)
    parser.add_argument("--info", "-i", nargs="?", const="all")
    args, unknown = parser.parse_known_args(argv[1:])
    prints = args.help or args.hydra_help or args.version or args.shell_completion
    return None if unknown or prints or args.cfg or args.info else args  # Hydra refuses unknown


def compose_as_hydra(tool: str, args: argparse.Namespace):
    """The config Hydra is about to compose for this command line (with its hydra node), through
    Hydra's public compose API and config loader; None where Hydra itself will refuse it."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    overrides = list(args.overrides)
    if args.config_dir:
        overrides.append(f"hydra.searchpath=[file://{Path(args.config_dir).resolve()}]")
    name = args.config_name or tool.removeprefix("gptlab-")  # gptlab-eval: conf/eval.yaml
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        modes = [RunMode.MULTIRUN] if args.multirun else [RunMode.RUN, RunMode.MULTIRUN]
        for mode in modes:  # a config may ask for a multirun itself (hydra.mode=MULTIRUN)
            try:
                return loader.load_configuration(name, overrides, run_mode=mode)
            except Exception:  # reported by Hydra in a moment, the same way as always
                continue
    return None


def check_before_hydra(tool: str, argv: list[str]) -> bool | None:
    """Hydra builds hydra.callbacks (and a sweep's launcher and sweeper) before a task starts, so
    what it would build is checked here first, on the same command line. Returns whether the
    command line composes (None: Hydra will only print)."""
    args = hydra_arguments(argv)
    if args is None:
        return None
    unsupported = {
        "config_path": "--config-path: the tools read their configs from the package (add a "
        "folder of configs with --config-dir)",
        "experimental_rerun": "--experimental-rerun: it unpickles a file, which runs code",
    }
    for key, reason in unsupported.items():
        if getattr(args, key):
            raise ConfigError(f"{reason}; it is not supported. Give the overrides instead.")
    cfg = compose_as_hydra(tool, args)
    if cfg is None:
        return False
    from hydra.types import RunMode

    from gptlab.config.trust import check_hydra_node

    check_hydra_node(cfg, args.multirun or cfg.hydra.mode == RunMode.MULTIRUN)
    return True


def run_hydra_app(hydra_main: Callable[[], object], tool: str) -> None:
    """Run a `@hydra.main` function; Hydra's exit 1 for a config it cannot compose becomes exit 2
    with a pointer to `--help` (Hydra has printed the error, without a traceback). What Hydra
    builds itself (hydra.callbacks, the launcher, the sweeper) is checked first."""
    try:
        composes = check_before_hydra(tool, sys.argv)
    except ConfigError as e:
        print(f"{tool}: {e}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    try:
        hydra_main()
    except SystemExit as e:
        if e.code == FAILED and composes is False:
            print(
                f"{tool}: the configuration above cannot be composed; `{tool} --help` lists the "
                "groups, options and keys.",
                file=sys.stderr,
            )
            sys.exit(BAD_INPUT)
        raise


def resolve_device(device: str) -> str:
    """auto -> cuda when available, else cpu. The name is checked before torch is imported."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device={device!r}: choose one of auto, cpu, cuda.")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device=cuda: torch sees no CUDA device here. Use device=cpu or device=auto."
        )
    return "cuda" if device != "cpu" and torch.cuda.is_available() else "cpu"
