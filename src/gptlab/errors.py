"""The one error type a user should see: bad input, explained in one paragraph, exit code 2."""

import logging
import sys
from collections.abc import Callable


class ConfigError(ValueError):
    """A configuration or input problem. The message names the key or file and the way out."""


class Task:
    started = False  # set once Hydra hands a composed config to a task


def run_or_exit(task, cfg, log: logging.Logger):
    """Run a tool's Hydra task; a ConfigError ends it with its paragraph and exit code 2."""
    Task.started = True
    try:
        return task(cfg)
    except ConfigError as e:
        log.error("%s", e)
        sys.exit(2)


def main_or_exit(hydra_main: Callable[[], object], tool: str) -> None:
    """Run a `@hydra.main` function. A config Hydra cannot compose (unknown key or option, wrong type)
    exits 1 before any task starts, reported without a traceback; gptlab makes that exit code 2."""
    try:
        hydra_main()
    except SystemExit as e:
        if e.code == 1 and not Task.started:
            print(f"{tool}: the configuration above cannot be composed; `{tool} --help` lists the groups, "
                  "options and keys.", file=sys.stderr)
            sys.exit(2)
        raise


def check_whole_number(cfg, key: str, minimum: int, meaning: str) -> None:
    """cfg[key] must be a whole number of at least `minimum`; else a ConfigError saying what it is for."""
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r}: {meaning}; give a whole number of at least {minimum}.")
