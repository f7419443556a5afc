"""The one error type a user should see: bad input, explained in one paragraph."""


class ConfigError(ValueError):
    """A configuration or input problem. The message names the key or file and the way out."""
