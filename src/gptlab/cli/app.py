"""What every command-line tool shares: Hydra composes its command line and runs its task; bad
input ends in one paragraph with exit code 2 (gptlab.exits), whether Hydra's composition found it
or the task; Ctrl-C or SIGTERM during the start in one line; a failed start leaves nothing it made
(gptlab.run.place). And the device a tool runs on."""

import contextlib
import difflib
import io
import logging
import os
import sys
from collections.abc import Callable
from importlib.resources import files
from typing import Any

from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from hydra.main import get_args_parser
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from gptlab.errors import ConfigError, Refusal, raised_within
from gptlab.exits import BAD_INPUT, CTRL_C, SIGTERM, catch_ctrl_c, stop_at_ctrl_c
from gptlab.process import Terminated, sigterm_raises
from gptlab.run.overrides import override_key
from gptlab.run.place import PLACE

FULL_ERROR = "HYDRA_FULL_ERROR"  # Hydra's switch: raise its errors, do not print them


def run_task(task: Callable[[DictConfig], Any], cfg: DictConfig, log: logging.Logger) -> Any:
    """A tool's Hydra task; a ConfigError ends it with exit code 2, what its start made removed."""
    try:
        return task(cfg)
    except ConfigError as e:
        log.error("%s", e)
        PLACE.undo()
        sys.exit(BAD_INPUT)


def run_hydra_app(hydra_main: Callable[[], object], tool: str) -> None:
    """Run a `@hydra.main` function; Hydra's own errors (a key, a group's option, a value's type)
    come back as exceptions, said here in one paragraph, exit code 2."""
    conflict = command_conflict(sys.argv[1:])
    if conflict:
        print(f"{tool}: {conflict}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    sys.argv = resolved_job_config(sys.argv)
    stopping = catch_ctrl_c()  # a KeyboardInterrupt, caught below: what the start made removed
    users = os.environ.get(FULL_ERROR)  # the user's wish for whole tracebacks stays theirs
    os.environ[FULL_ERROR] = "1"
    try:
        with sigterm_raises():  # a SIGTERM before training undoes the start as Ctrl-C does
            hydra_main()
    except (ConfigError, Refusal) as e:
        PLACE.undo()
        print(f"{tool}: {e}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    except KeyboardInterrupt:
        PLACE.undo()
        print(f"{tool}: stopped by Ctrl-C.", file=sys.stderr)
        sys.exit(CTRL_C)
    except Terminated:
        PLACE.undo()
        print(f"{tool}: stopped by SIGTERM.", file=sys.stderr)
        sys.exit(SIGTERM)
    except (HydraException, OmegaConfBaseException) as e:
        if users or PLACE.roots:  # not a command line Hydra could not compose: a traceback
            PLACE.undo()
            raise
        print(f"{tool}: {explain(tool, e)}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    except Exception:  # a crash before training: its traceback, and nothing it made left
        PLACE.undo()
        raise
    finally:
        if users is None:
            os.environ.pop(FULL_ERROR, None)
        if stopping:  # a Ctrl-C on the way out: one line again
            stop_at_ctrl_c(tool)


COMMANDS = {  # Hydra's commands, of which a command line gives one: its parsed field -> its flag
    "run": "--run",
    "multirun": "-m (--multirun)",
    "cfg": "--cfg",
    "info": "--info",
    "shell_completion": "--shell-completion",
}


def command_conflict(argv: list[str]) -> str | None:
    """Two of Hydra's commands on one command line (`-m ... --cfg job`), read from Hydra's own
    argument parser before Hydra raises its ValueError: the paragraph that says what to drop."""
    args = parsed(argv)
    if args is None:
        return None
    commands = [
        flag for field, flag in COMMANDS.items() if getattr(args, field, None) not in (None, False)
    ]
    if len(commands) < 2:
        return None
    said = f"{' and '.join(commands)}: Hydra runs one of --run, --multirun, --cfg, --info and "
    if not args.multirun:
        return f"{said}--shell-completion per command line; give one of them."
    return (
        f"{said}--shell-completion per command line. To see what a sweep's jobs get, drop -m: "
        f"`--cfg {args.cfg or 'job'}` prints the composed config of one job, `--cfg hydra` "
        "shows the sweep's choices (hydra.sweeper.params)."
    )


def parsed(argv: list[str]):
    """The command line as Hydra's own argument parser reads it; None where it cannot."""
    try:
        quiet = io.StringIO()  # --version, a malformed flag: Hydra's to say, next
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            return get_args_parser().parse_args(argv)
    except SystemExit:
        return None


def resolved_job_config(argv: list[str]) -> list[str]:
    """`--cfg job` shows the values the job gets, resolved (Hydra's --resolve): model.depth's
    derived settings among them, not the interpolations that derive them."""
    args = parsed(argv[1:])
    if args is None or args.cfg != "job" or args.resolve:
        return argv
    return [*argv, "--resolve"]


def missing_group(tool: str) -> str | None:
    """A `group=option` of the command line that names a group of gptlab's configs (conf/data,
    gptlab-train's) which the tool's own config does not choose in its defaults list: Hydra can
    only say "Could not override"; the fix is the tool's own keys of that name, given alone."""
    conf = files("gptlab.conf")
    own = conf / f"{tool.removeprefix('gptlab-')}.yaml"
    if not own.is_file():
        return None
    config = OmegaConf.create(own.read_text())
    chosen = set()
    for entry in config.get("defaults") or []:
        for key in entry.keys() if OmegaConf.is_dict(entry) else []:
            name = str(key).removeprefix("override ").removeprefix("optional ").lstrip("/")
            chosen.add(name.split("/")[0].split("@")[0])
    for arg in sys.argv[1:]:
        group, sep, _ = arg.partition("=")
        if not sep or not group.isidentifier() or group in chosen or not (conf / group).is_dir():
            continue
        node = config.get(group)
        keys = [str(k) for k in node.keys()] if OmegaConf.is_dict(node) else []
        if not keys:
            return f"{arg}: {tool} has no {group} group (the {group} options are gptlab-train's)."
        return (
            f"{arg}: {tool} has no {group} group to choose from (the {group} options are "
            f"gptlab-train's). Give its {group} keys alone instead, e.g. `{group}.{keys[0]}=...` "
            f"(its {group} keys: {', '.join(keys)})."
        )
    return None


def did_you_mean(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, [str(c) for c in candidates], n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def given(key: str) -> str:
    """The command line's override of `key` as it was written, else the key."""
    return next((a for a in sys.argv[1:] if override_key(a) == key and "=" in a), key)


def explain(tool: str, error: Exception) -> str:
    """Hydra's composition error as one paragraph, from the exception's own fields: the key or
    the group's option, the reason, "did you mean" among its neighbours."""
    found = raised_within(error)  # a resolver's (model.depth=0): its own paragraph
    if found is not None:
        return str(found)
    cause = error.__cause__
    missing = missing_group(tool) if isinstance(error, ConfigCompositionException) else None
    if missing:
        return f"{missing} `{tool} --help` lists its keys."
    if isinstance(error, MissingConfigException) and "/" in str(error.missing_cfg_file):
        group, option = str(error.missing_cfg_file).rsplit("/", 1)
        options = list(error.options or [])
        where = f"{group}={option}"
        reason = f"the {group} group has no option {option!r}{did_you_mean(option, options)}"
        if options:
            reason += f" (its options: {', '.join(options)})"
    elif isinstance(cause, ConfigAttributeError | ConfigKeyError) and cause.full_key:
        where, parent = given(str(cause.full_key)), cause.parent_node
        keys = list(parent.keys()) if OmegaConf.is_dict(parent) else []
        node = where.rpartition(".")[0]
        node = f"the {node} node" if node else "the top level"
        reason = f"{node} has no key {str(cause.key)!r}{did_you_mean(str(cause.key), keys)}"
    elif isinstance(cause, OmegaConfBaseException) and cause.full_key:
        where, reason = given(str(cause.full_key)), str(cause.msg).splitlines()[0]
    else:
        where, reason = "the command line", " ".join(str(error).split())
    end = "" if reason.endswith(("?", ".")) else "."
    return f"{where}: {reason}{end} `{tool} --help` lists the groups, options and keys."


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


OFFLINE = ("offline", "disabled", "dryrun")  # W&B modes that need no login


def check_logins(loggers: DictConfig) -> None:
    """logger=wandb needs a W&B login or its offline mode (else W&B fails in the first step)."""
    for node in (loggers or {}).values():
        offline = node.get("offline") is True or os.environ.get("WANDB_MODE", "") in OFFLINE
        if not str(node.get("_target_", "")).endswith("WandbLogger") or offline:
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


def check_accelerator(accelerator: str | None) -> None:
    """trainer=gpu (or ddp) where torch sees no GPU: trainer=cpu named, before any data work."""
    if str(accelerator) not in ("gpu", "cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.accelerator={accelerator} (trainer=gpu, trainer=ddp): torch "
            f"{torch.__version__} sees no CUDA GPU here. Train on the CPU with trainer=cpu "
            "(trainer=ddp_cpu: two CPU processes), or trainer=default, which takes a GPU "
            "where there is one."
        )
