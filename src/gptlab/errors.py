"""The one error type a user should see: bad input, explained in one paragraph, exit code 2."""


class ConfigError(ValueError):
    """A configuration or input problem. The message names the key or file and the way out."""


class Refusal(BaseException):
    """A ConfigError raised where a library goes on after any Exception (Hydra only warns about a
    callback's): it passes through to the tool, which ends with its paragraph and exit code 2."""

    def __init__(self, error: ConfigError):
        super().__init__(str(error))


def check_whole_number(cfg, key: str, minimum: int, meaning: str) -> None:
    """cfg[key] must be a whole number of at least `minimum`; `meaning` says what it is for."""
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r}: {meaning}; give a whole number of at least {minimum}.")
