"""The one error type a user should see: bad input, explained in one paragraph."""

import logging
import sys


class ConfigError(ValueError):
    """A configuration or input problem. The message names the key or file and the way out."""


def run_or_exit(task, cfg, log: logging.Logger):
    """Run a tool's Hydra task; a ConfigError ends it with its paragraph and exit code 2."""
    try:
        return task(cfg)
    except ConfigError as e:
        log.error("%s", e)
        sys.exit(2)
