"""A task's config resolved once: what it builds (gptlab.cli.fit), what it shows, and where
nothing resolves a second time. A config is code (a `_target_` builds what it names): gptlab
builds only configs from your command line and your own runs, never one read from anyone else's
(docs/security.md)."""

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gptlab.errors import ConfigError, raised_within
from gptlab.run.overrides import escape_interpolation


def resolve(node: DictConfig | ListConfig, where: str) -> Any:
    try:
        return OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as e:
        found = raised_within(e)  # a resolver's own paragraph (gptlab.config.depth)
        if found is not None:
            raise found from None
        key = f"{where}.{e.full_key}" if getattr(e, "full_key", None) else where
        reason = " ".join(str(e).split("\n")[0].split())
        raise ConfigError(
            f"{key}: cannot be resolved ({reason}). Fix or remove the override that sets it."
        ) from None


def escape(node: Any) -> Any:
    """Every `${` a resolved string holds, escaped: nothing resolves it a second time."""
    if isinstance(node, dict):
        return {key: escape(value) for key, value in node.items()}
    if isinstance(node, list):
        return [escape(value) for value in node]
    if isinstance(node, str):
        return escape_interpolation(node)
    return node


def resolved(cfg: DictConfig) -> DictConfig:
    """The task config resolved once: what is built, and what is shown."""
    plain = resolve(cfg, "config")
    resolved = OmegaConf.create(escape(plain))
    OmegaConf.set_struct(resolved, True)
    return resolved
