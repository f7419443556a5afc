"""The data module's settings checked before any download or tokenization: exit 2 at once."""

from gptlab.errors import ConfigError


def check_settings(settings: dict) -> None:
    """Every setting that can be checked without the data, before any download or tokenization."""
    for key in ("batch_size", "context_length"):
        if settings[key] < 1:
            raise ConfigError(f"data.{key}={settings[key]}: it must be a positive integer.")
    val_fraction = settings["val_fraction"]
    test_fraction = settings["test_fraction"]
    if not 0.0 < val_fraction <= 1.0:
        raise ConfigError(
            f"data.val_fraction={val_fraction}: it must lie in (0, 1] (1: no train split)."
        )
    if not 0.0 <= test_fraction < 1.0 or val_fraction + test_fraction > 1.0:
        raise ConfigError(
            f"data.test_fraction={test_fraction}: it must lie in [0, 1) and leave "
            f"data.val_fraction={val_fraction} room (their sum at most 1; 0: no test split)."
        )
    for key in ("val_tokens", "test_tokens", "repeat_batches"):
        if settings[key] is not None and settings[key] < 1:
            raise ConfigError(f"data.{key}={settings[key]}: it must be positive or null.")
    if settings["num_workers"] < 0:
        raise ConfigError(f"data.num_workers={settings['num_workers']}: it must be 0 or more.")
