"""A tool's command line composed as Hydra is about to, before Hydra and any heavy import: a
mistake ends in one paragraph ("did you mean"); what Hydra builds itself is checked too."""

import argparse
import difflib
import os
import re
from pathlib import Path
from typing import Any

from gptlab.errors import ConfigError

OFFLINE = ("offline", "disabled", "dryrun")  # W&B modes that need no login
SUBDIR = re.compile(r"[\w.-]*\$\{hydra\.job\.(num|id)\}[\w.-]*")
UNSUPPORTED = {
    "config_path": "--config-path: the tools read their configs from the package (add a folder "
    "of configs with --config-dir)",
    "experimental_rerun": "--experimental-rerun: it unpickles a file, which runs code",
}
# what a tool without a group says instead (the group of gptlab-train it was given)
NO_GROUP = {
    ("gptlab-eval", "data"): "it scores the checkpoint on its run's own text, or on another "
    "text given by data.path=<file> (all of it) or data.url=https://... alone",
}


def hydra_arguments(argv: list[str]) -> argparse.Namespace | None:
    """Hydra's own flags of a command line; None when Hydra will only print (--help, --cfg)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("overrides", nargs="*")
    for flags in (("--help", "-h"), ("--hydra-help",), ("--version",), ("--resolve",)):
        parser.add_argument(*flags, action="store_true")
    parser.add_argument("--run", "-r", action="store_true")
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


def compose(tool: str, args: argparse.Namespace, overrides: list[str]) -> tuple[Any, Exception]:
    """(the config with its hydra node, None) as Hydra composes it, or (None, the error)."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    if args.config_dir:
        overrides = [*overrides, f"hydra.searchpath=[file://{Path(args.config_dir).resolve()}]"]
    name = args.config_name or tool.removeprefix("gptlab-")  # gptlab-eval: conf/eval.yaml
    GlobalHydra.instance().clear()
    errors = []
    try:
        with initialize_config_module("gptlab.conf", version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            modes = [RunMode.MULTIRUN] if args.multirun else [RunMode.RUN, RunMode.MULTIRUN]
            for mode in modes:  # a config may ask for a multirun itself (hydra.mode=MULTIRUN)
                try:
                    return loader.load_configuration(name, overrides, run_mode=mode), None
                except Exception as e:  # noqa: BLE001 - Hydra's errors, explained below
                    errors.append(e)
    finally:
        GlobalHydra.instance().clear()
    return None, errors[0]


def did_you_mean(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, [str(c) for c in candidates], n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def unknown_key(tool: str, args: argparse.Namespace, key: str) -> str:
    """Where `key` was not found, with a suggestion from its neighbours."""
    from omegaconf import OmegaConf

    others = [o for o in args.overrides if not o.lstrip("+~").startswith(f"{key}=")]
    cfg, _ = compose(tool, args, others)
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if cfg is not None and parent else cfg
    keys = list(node.keys()) if OmegaConf.is_dict(node) else []
    where = f"the {parent} node" if parent else "the top level"
    return f"{where} has no key {leaf!r}{did_you_mean(leaf, keys)}"


def explain(tool: str, args: argparse.Namespace, error: Exception) -> str:
    """Hydra's composition error as one paragraph naming the override and the way out."""
    text = str(error)
    missing = re.search(r"Could not override '([^']+)'", text)
    option = re.search(r"Could not find '([^'/]+)/([^']+)'", text)
    no_group = re.search(r"Could not override '([^']+)'\. No match in the defaults list", text)
    if missing and type(error.__cause__).__name__ == "ConfigAttributeError":
        override = next((o for o in args.overrides if missing.group(1) in o), missing.group(1))
        reason = unknown_key(tool, args, missing.group(1))
    elif no_group:
        group = no_group.group(1)
        override = next(
            (o for o in args.overrides if o.lstrip("+~").startswith(f"{group}=")), group
        )
        reason = f"{tool} has no {group} group"
        reason += f": {NO_GROUP[tool, group]}; drop {override}" if (tool, group) in NO_GROUP else ""
    elif option:
        group, choice = option.groups()
        listed = re.findall(r"^\t(\S+)$", text.split("Config search path")[0], re.M)
        override = f"{group}={choice}"
        reason = f"the {group} group has no option {choice!r}{did_you_mean(choice, listed)}"
        reason += f" (its options: {', '.join(listed)})" if listed else ""
    else:
        cause = error.__cause__ or error
        quoted = re.findall(r"'([^']+)'", text) + [text]
        override = next((o for o in args.overrides for q in quoted if q in o or o in q), None)
        reason = " ".join(str(cause).split("\n")[0].split()).rstrip(".")
    end = "" if reason.endswith("?") else "."
    return (
        f"{override or 'the command line'}: {reason}{end} `{tool} --help` lists the groups, "
        "options and keys."
    )


def output_place(cfg: Any, multirun: bool) -> tuple[Path, str]:
    """(where Hydra will write, the key that says so), resolved as Hydra resolves it whatever its
    spelling; a start's config folder and a sweep's job folders inside are gptlab's to name."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    hydra = OmegaConf.to_container(cfg.hydra, resolve=False)
    if hydra.get("output_subdir") not in (None, "${gptlab.start_subdir:}"):
        raise ConfigError(
            "hydra.output_subdir: gptlab decides where a start saves its config (.hydra, then a "
            "folder of its own for each later start); give null to save none, or drop it."
        )
    if multirun and not SUBDIR.fullmatch(str(hydra["sweep"]["subdir"])):
        raise ConfigError(
            f"hydra.sweep.subdir={hydra['sweep']['subdir']}: a job's folder is named by its "
            "number inside the sweep directory (${hydra.job.num}, with plain text around it); "
            "drop the override."
        )
    setup_globals()  # Hydra's own resolvers (now, hydra)
    saved = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
    except Exception as e:  # noqa: BLE001 - OmegaConf's errors, explained
        raise ConfigError(f"{key}: cannot be resolved ({' '.join(str(e).split())}).") from None
    finally:
        HydraConfig.instance().cfg = saved
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}={value!r}: give a directory.")
    return Path(value).expanduser(), key


def check_logins(cfg: Any) -> None:
    """logger=wandb needs a W&B login or its offline mode (else W&B fails in the first step)."""
    for node in (cfg.get("logger") or {}).values():
        if not str(node.get("_target_", "")).endswith("WandbLogger"):
            continue
        if node.get("offline") is True or os.environ.get("WANDB_MODE", "").lower() in OFFLINE:
            continue
        import wandb

        try:
            wandb.login(verify=False)  # finds a key (WANDB_API_KEY, ~/.netrc) or asks at a tty
        except wandb.errors.UsageError as e:
            raise ConfigError(
                f"logger=wandb: W&B has no login here ({e}). Run `wandb login` (or set "
                "WANDB_API_KEY), or log without an account: WANDB_MODE=offline keeps the run on "
                "disk and `wandb sync <run dir>/wandb/offline-run-*` uploads it later."
            ) from None


def check_command_line(tool: str, argv: list[str]) -> tuple[Any, bool] | None:
    """(the composed config, whether a multirun), checked; None when Hydra will only print."""
    args = hydra_arguments(argv)
    if args is None:
        return None
    for key, reason in UNSUPPORTED.items():
        if getattr(args, key):
            raise ConfigError(f"{reason}; it is not supported. Give the overrides instead.")
    cfg, error = compose(tool, args, list(args.overrides))
    if cfg is None:
        raise ConfigError(explain(tool, args, error))
    from hydra.types import RunMode

    from gptlab.config.trust import check_hydra_node

    multirun = args.multirun or cfg.hydra.mode == RunMode.MULTIRUN
    check_hydra_node(cfg, multirun)
    check_logins(cfg)
    return cfg, multirun
