"""gptlab.config: the typed schemas (built from the real classes, enforced by Hydra's compose API)
and the resolvers (a unique run directory, DDP's start method, the run names outside Hydra)."""

import dataclasses
import inspect
from pathlib import Path
from typing import Any, Optional

import lightning as L
import pytest
from helpers import run_cli, run_main, train_without_torch
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from gptlab.config import resolvers
from gptlab.config.schemas import (
    TrainerSettings,
    TrainSchema,
    omegaconf_type,
    register_configs,
    schema_for,
)
from gptlab.data.config import DataConfig
from gptlab.data.datamodule import GPTDataModule
from gptlab.model.config import GPTConfig
from gptlab.training.optim_config import OptimConfig

register_configs()  # what composing conf/train.yaml needs


def composed(*overrides: str):
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        return compose("train", overrides=list(overrides))


def fields_of(schema: type) -> dict[str, dataclasses.Field]:
    return {field.name: field for field in dataclasses.fields(schema)}


def default_of(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


# ---------------------------------------------------------------------------------------------
# schemas


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (int, int),
        (float, float),
        (bool, bool),
        (str, str),
        (int | None, Optional[int]),  # noqa: UP045 - OmegaConf's spelling
        (Optional[str], Optional[str]),  # noqa: UP045
        (list[int], list[int]),
        (list[str] | None, Any),  # an optional list: not checked
        (int | str, Any),  # a union OmegaConf cannot check
        (dict[str, int], Any),
        (list[dict], Any),
        (GPTConfig, Any),
    ],
)
def test_omegaconf_type_keeps_what_omegaconf_can_check(annotation, expected):
    assert omegaconf_type(annotation) == expected


def test_the_model_schema_has_every_field_of_gptconfig_with_its_default():
    schema = fields_of(schema_for(GPTConfig))
    config_fields = dataclasses.fields(GPTConfig)
    assert list(schema) == ["_target_", *(field.name for field in config_fields)]
    assert schema["_target_"].default == "gptlab.model.config.GPTConfig"
    defaults = GPTConfig()
    for field in config_fields:
        assert default_of(schema[field.name]) == getattr(defaults, field.name), field.name
    assert schema["d_model"].type is int
    assert schema["dropout"].type is float
    assert schema["vocab_size"].type == Optional[int]  # noqa: UP045


def test_the_optim_schema_has_the_optimizer_defaults():
    schema = fields_of(schema_for(OptimConfig))
    defaults = OptimConfig()
    assert schema["_target_"].default == "gptlab.training.optim_config.OptimConfig"
    for field in dataclasses.fields(OptimConfig):
        assert default_of(schema[field.name]) == getattr(defaults, field.name), field.name
    assert schema["betas"].type == list[float]


def test_the_trainer_schema_is_lightnings_own_signature():
    """The Trainer's keyword arguments are listed by hand (composing imports no Lightning): the
    same names, OmegaConf types and defaults as Lightning's signature, but the callbacks and
    loggers gptlab passes itself."""
    parameters = inspect.signature(L.Trainer.__init__, eval_str=True).parameters
    lightning = {
        name: (omegaconf_type(p.annotation), p.default)
        for name, p in list(parameters.items())[1:]
        if name not in ("callbacks", "logger")
    }
    schema = fields_of(schema_for(TrainerSettings, "lightning.Trainer"))
    listed = {name: (f.type, f.default) for name, f in schema.items() if name != "_target_"}
    assert listed == lightning
    assert schema["max_steps"].type is int and schema["_target_"].default == "lightning.Trainer"


def test_the_data_schema_is_the_data_modules_settings():
    """The data group's schema: DataConfig's fields and defaults, built as GPTDataModule."""
    schema = fields_of(composed().data._metadata.object_type)
    assert [name for name in schema if name != "_target_"] == [
        f.name for f in dataclasses.fields(DataConfig)
    ]
    assert schema["batch_size"].type is int and schema["batch_size"].default == 16
    assert schema["path"].type == Optional[str]  # noqa: UP045
    assert schema["tokenizer"].type is Any
    assert GPTDataModule(batch_size=4).settings == DataConfig(batch_size=4)


def test_the_entry_points_check_a_command_line_without_torch_or_lightning(tmp_path):
    """A config mistake is reported by Hydra's own composition before the heavy imports: exit
    code 2, one paragraph with "did you mean", and neither torch nor Lightning loaded."""
    out = train_without_torch("model.num_head=8", cwd=tmp_path)
    assert out.stdout == "2\n[]\n", out.stderr
    assert "did you mean num_heads?" in out.stderr and len(out.stderr.splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing made


def test_multirun_with_cfg_is_one_paragraph_and_exit_code_2(tmp_path):
    """`-m ... --cfg job`: Hydra's ValueError traceback becomes one paragraph, found in the
    command line Hydra's own parser reads, before Hydra starts; nothing made."""
    result = run_cli("-m", "experiment=mutransfer", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert "-m (--multirun) and --cfg" in result.stderr and "drop -m" in result.stderr
    assert not list(tmp_path.iterdir())
    assert run_cli("experiment=mutransfer", "--cfg", "job", cwd=tmp_path).returncode == 0


def test_the_top_level_schema_types_the_keys_of_train_yaml():
    top = fields_of(TrainSchema)
    assert top["seed"].type is int and top["seed"].default == composed().seed


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.num_head=4", "Could not override 'model.num_head'"),
        ("optim.lrr=1", "Could not override 'optim.lrr'"),
        ("trainer.max_epoch=3", "Could not override 'trainer.max_epoch'"),
        ("trainer.max_steps=abc", "Error merging override trainer.max_steps=abc"),
        ("data.batch_size=big", "Error merging override data.batch_size=big"),
        ("seed=abc", "Error merging override seed=abc"),
    ],
)
def test_a_mistyped_key_or_a_wrong_type_fails_at_composition(override, message):
    with pytest.raises(ConfigCompositionException, match=message):
        composed(override)


def test_a_mistyped_key_in_a_yaml_option_fails_at_composition(tmp_path):
    """A user's own model option extends the schema as conf/model/default.yaml does: a key the
    schema does not have fails when Hydra composes it, and the correct key composes."""
    (tmp_path / "model").mkdir()
    option = "defaults:\n  - /model_schema@_here_\n  - _self_\n\n"
    (tmp_path / "model" / "mine.yaml").write_text(option + "num_head: 8\n")
    (tmp_path / "model" / "right.yaml").write_text(option + "num_heads: 8\n")
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"
    with pytest.raises(ConfigCompositionException) as info:
        composed(searchpath, "model=mine")
    assert "Key 'num_head' not in 'GPTConfigSchema'" in str(info.value)
    assert composed(searchpath, "model=right").model.num_heads == 8


def test_register_configs_twice_keeps_one_set_of_resolvers():
    register_configs()
    for name in ("unique_dir", "gptlab.run_name", "gptlab.sweep_name", "gptlab.mlflow_run"):
        assert OmegaConf.has_resolver(name)
    assert composed("model=tiny").model.d_model == 64


# ---------------------------------------------------------------------------------------------
# resolvers


def test_unique_dir_names_a_directory_that_does_not_exist_and_makes_nothing(tmp_path):
    """A resolver computes a value and has no effect: gptlab.run.place creates the folder."""
    base = tmp_path / "outputs" / "12-00-00"
    assert resolvers.unique_dir(str(base)) == resolvers.unique_dir(str(base)) == str(base)
    assert not (tmp_path / "outputs").exists()
    base.mkdir(parents=True)
    assert resolvers.unique_dir(str(base)) == f"{base}_1"
    Path(f"{base}_1").symlink_to(tmp_path / "nowhere")  # a dangling link takes the name too
    assert resolvers.unique_dir(str(base)) == f"{base}_2"
    assert sorted(p.name for p in base.parent.iterdir()) == ["12-00-00", "12-00-00_1"]


def test_the_run_names_outside_a_hydra_run_are_empty():
    """--cfg job, a test or a notebook: no run directory, so no names and no MLflow run."""
    assert resolvers.run_name() is None
    assert resolvers.sweep_name() is None
    assert resolvers.sweep_name("default") == "default"
    assert resolvers.run_info("gptlab.") == {}
    assert resolvers.run_id() is None
    assert (
        resolvers.mlflow_run("sqlite:///nowhere.db", "gptlab", OmegaConf.create({"resume": "x"}))
        is None
    )


def test_a_composed_hydra_config_without_a_run_dir_has_no_run_names():
    """A notebook may compose with the Hydra config and set it, as --help and --cfg do: it has
    no output_dir, so still no names."""
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        assert OmegaConf.is_missing(HydraConfig.get().runtime, "output_dir")
        assert resolvers.run_name() is None
        assert resolvers.sweep_name("default") == "default"
        assert resolvers.run_info("gptlab.") == {}
    finally:
        HydraConfig.instance().cfg = None


def test_the_in_process_help_leaves_no_hydra_job_config_behind(tmp_path):
    """run_main puts Hydra's job config back, so later tests in this worker see no run."""
    result = run_main("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not HydraConfig.initialized()
    assert resolvers.run_name() is None


def test_mlflow_artifacts_live_beside_a_local_store(tmp_path):
    store = f"sqlite:///{tmp_path}/outputs/mlflow.db"
    assert resolvers.mlflow_artifacts(store) == f"{tmp_path}/outputs/mlartifacts"
    assert resolvers.mlflow_artifacts("http://localhost:5000") is None


def test_ddp_start_method_spawns_unless_a_launcher_started_the_ranks(monkeypatch):
    for name in ("SLURM_NTASKS", "SLURM_JOB_NAME", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    assert resolvers.ddp_start_method() == "spawn"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-1")  # what torchrun sets in every rank
    assert resolvers.ddp_start_method() == "popen"
