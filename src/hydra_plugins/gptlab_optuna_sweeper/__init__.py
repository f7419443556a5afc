"""gptlab's Optuna sweeper for Hydra: a study on disk shared with the jobs (pruning, resume).

Hydra finds plugins by walking the `hydra_plugins` namespace package; an editable install hides
this one behind an import hook that walk does not follow, so gptlab registers it itself."""


def register() -> None:
    """Register the config nodes and the sweeper class with Hydra (harmless when already known)."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.gptlab_optuna_sweeper import config  # noqa: F401 - stores the config nodes
    from hydra_plugins.gptlab_optuna_sweeper.sweeper import GptlabOptunaSweeper

    Plugins.instance().register(GptlabOptunaSweeper)
