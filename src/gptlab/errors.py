"""The one error type a user should see: bad input, explained in one paragraph, exit code 2."""


class ConfigError(ValueError):
    """A configuration or input problem. The message names the key or file and the way out."""


class Refusal(BaseException):
    """A ConfigError raised where a library goes on after any Exception (Hydra only warns about a
    callback's): it passes through to the tool, which ends with its paragraph and exit code 2."""

    def __init__(self, error: ConfigError):
        super().__init__(str(error))


def raised_within(error: BaseException | None) -> ConfigError | None:
    """The ConfigError under a library's wrapping of it (a resolver's, inside OmegaConf's
    InterpolationResolutionError), if any: said as it is, not as the wrapper words it."""
    while error is not None and not isinstance(error, ConfigError):
        error = error.__cause__ or error.__context__
    return error


def whole_number(
    key: str, value, minimum: int = 1, none: bool = False, meaning: str | None = None
) -> int | None:
    """`value`, a setting that counts, if a whole number of at least `minimum` (or None where
    `none`: all); else a ConfigError naming `key` and, where given, what it is for."""
    if (value is None and none) or (type(value) is int and value >= minimum):
        return value
    what = f" {meaning};" if meaning else ""
    also = " (or null: all)" if none else ""
    raise ConfigError(f"{key}={value!r}:{what} give a whole number of at least {minimum}{also}.")


def check_whole_number(cfg, key: str, minimum: int, meaning: str) -> None:
    """cfg[key] must be a whole number of at least `minimum`; `meaning` says what it is for."""
    whole_number(key, cfg[key], minimum, meaning=meaning)
