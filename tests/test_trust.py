"""What a config may build, and inputs that could make gptlab run or fetch what it should not.
Each attack plants a marker its payload would create, and each test asserts it is absent."""

from __future__ import annotations

import hashlib
import json
import pickle
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import check, own_copy, run_cli, run_main
from hydra import compose, initialize_config_module
from lightning.pytorch.loggers import CSVLogger
from omegaconf import OmegaConf

from gptlab.config.schemas import register_configs
from gptlab.config.trust import build, check_hydra_node, checked
from gptlab.data.corpus import download
from gptlab.errors import ConfigError

# oc.decode turns a string into a node: `_target_` is spelled nowhere in the override
DECODED = (
    "'${{oc.decode:\"{{_tar${{oc.env:NOPE,get_}}: torch.load, f: {payload}, "
    "weights_only: false}}\"}}'"
)
TOOLS = ("gptlab-train", "gptlab-eval", "gptlab-generate", "gptlab-inspect")


class Touch:
    """Unpickling this creates a file: proof that something ran the pickle."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def plant_pickle(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "PWNED"
    payload = tmp_path / "notes.pt"
    payload.write_bytes(pickle.dumps(Touch(marker)))
    return payload, marker


# ------------------------------------------------------------------ the check, in this process
def test_plain_classes_pass_and_functions_or_other_kinds_are_refused():
    ok = checked(OmegaConf.create({"cb": {"_target_": "lightning.pytorch.callbacks.Timer"}}))
    assert ok.cb._target_ == "lightning.pytorch.callbacks.Timer"
    for target, needle in (
        ("torch.load", "torch.load is a function, not a class"),
        ("builtins.open", "builtins.open"),
        ("torch.nn.Linear", "class of another kind"),
        ("os.system", "os.system"),
    ):
        with pytest.raises(ConfigError, match="cb._target_") as err:
            checked(OmegaConf.create({"cb": {"_target_": target}}))
        assert needle in str(err.value)


def test_a_target_built_by_oc_decode_is_seen_and_refused(tmp_path):
    payload, marker = plant_pickle(tmp_path)
    override = DECODED.format(payload=payload)
    cfg = OmegaConf.create({"callbacks": {"pwn": override.strip("'")}})
    unresolved = OmegaConf.to_container(cfg)["callbacks"]["pwn"]
    assert unresolved.startswith("${oc.decode:") and "_target_" not in unresolved.split(",")[0]
    with pytest.raises(ConfigError, match=r"callbacks\.pwn\._target_='torch\.load'"):
        checked(cfg)
    assert not marker.exists()


@pytest.mark.parametrize(
    "node, where",
    [
        (
            {"_target_": "lightning.Trainer", "plugins": [{"_target_": "builtins.exec"}]},
            "x.plugins[0]",
        ),
        ({"_target_": "lightning.Trainer", "_args_": [{"_target_": "os.system"}]}, "x._args_[0]"),
        ({"deep": {"deeper": [{"_target_": "subprocess.Popen"}]}}, "x.deep.deeper[0]"),
    ],
)
def test_nested_targets_and_positional_arguments_are_checked(node, where):
    with pytest.raises(ConfigError) as err:
        checked(OmegaConf.create({"x": node}))
    assert f"{where}._target_=" in str(err.value)


def test_partial_is_refused_with_a_clear_message():
    node = {"_target_": "lightning.pytorch.callbacks.Timer", "_partial_": True}
    with pytest.raises(ConfigError, match=r"cb\._partial_: _partial_ is not supported here"):
        checked(OmegaConf.create({"cb": node}))


def test_what_was_checked_is_built_and_nothing_resolves_twice(tmp_path, monkeypatch):
    """Hydra's instantiate resolves a `${` that resolving left (here from an escaped string) a
    second time, unchecked: such a value is refused in what is built, kept literal elsewhere."""
    monkeypatch.setenv("GPTLAB_TEST_SECRET", "s3cret")
    logger = {
        "_target_": "lightning.pytorch.loggers.CSVLogger",
        "save_dir": "${dir}",
        "version": "v${oc.env:GPTLAB_TEST_SECRET}",
    }
    cfg = OmegaConf.create({"dir": str(tmp_path), "logger": logger})
    built = build(checked(cfg).logger, "logger")
    assert isinstance(built, CSVLogger)
    assert built.save_dir == str(tmp_path) and built.version == "vs3cret"
    cfg.prompt = "\\${oc.env:GPTLAB_TEST_SECRET}"
    assert checked(cfg).prompt == "${oc.env:GPTLAB_TEST_SECRET}"  # not built: stays literal
    cfg.logger.name = "\\${oc.env:GPTLAB_TEST_SECRET}"
    with pytest.raises(ConfigError, match=r"logger\.name='\$\{oc\.env:GPTLAB_TEST_SECRET\}'"):
        checked(cfg)


def compose_train(*overrides: str):
    register_configs()  # the schemas, as the tools register them
    with initialize_config_module("gptlab.conf", version_base="1.3"):
        return compose("train", list(overrides), return_hydra_config=True)


def test_hydra_callbacks_allow_gptlab_and_hydra_callbacks_only():
    check_hydra_node(compose_train(), multirun=True)  # the shipped SweepSummary
    hydra_own = "hydra.experimental.callbacks.LogJobReturnCallback"
    check_hydra_node(compose_train(f"+hydra.callbacks.log._target_={hydra_own}"), False)
    for overrides, needle in (
        (["+hydra.callbacks.x._target_=builtins.open"], "hydra.callbacks.x._target_="),
        (["+hydra.callbacks.x._target_=gptlab.training.callbacks.GracefulStop"], "another kind"),
        (["+hydra.callbacks.x='${oc.decode:\"{_target_: builtins.open}\"}'"], "literal"),
    ):
        with pytest.raises(ConfigError, match="hydra.callbacks.x") as err:
            check_hydra_node(compose_train(*overrides), multirun=False)
        assert needle in str(err.value)


def test_a_sweeps_launcher_and_sweeper_are_resolved_and_checked():
    check_hydra_node(compose_train("hparams_search=optuna"), multirun=True)  # Optuna's sampler
    check_hydra_node(compose_train("hydra/launcher=slurm"), multirun=True)
    decoded = "'${oc.decode:\"{_target_: builtins.open, file: x}\"}'"
    planted = f"+hydra.launcher.additional_parameters.x={decoded}"
    with pytest.raises(ConfigError, match=r"launcher\.additional_parameters\.x\._target_="):
        check_hydra_node(compose_train("hydra/launcher=slurm", planted), multirun=True)


# ------------------------------------------------------------------ the real console scripts
def test_the_oc_decode_attack_runs_no_code(tmp_path):
    payload, marker = plant_pickle(tmp_path)
    override = f"+callbacks.pwn={DECODED.format(payload=payload)}"
    result = run_cli("debug=fast", "hydra.run.dir=run", override, cwd=tmp_path, timeout=180)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "callbacks.pwn._target_='torch.load'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("tool", TOOLS)
def test_a_hydra_callback_from_the_command_line_is_refused_before_hydra_builds_it(tmp_path, tool):
    marker = tmp_path / "PWNED"
    evil = [
        "+hydra.callbacks.x._target_=builtins.open",
        f"+hydra.callbacks.x.file={marker}",
        "+hydra.callbacks.x.mode=w",
    ]
    modes = [evil, ["-m", *evil]] if tool == "gptlab-train" else [evil]  # -m: the same check
    for args in modes:
        result = run_main(*args, cwd=tmp_path, tool=tool)
        assert result.returncode == 2, result.stderr[-3000:]
        assert "hydra.callbacks.x._target_='builtins.open'" in result.stderr
        assert "Traceback" not in result.stderr
        assert not marker.exists()  # builtins.open(marker, "w") never ran
        assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # nothing written


def test_a_hydra_callback_from_a_config_dir_is_refused_too(tmp_path):
    """--config-dir adds a folder of configs: what Hydra composes from it is what is checked."""
    marker = tmp_path / "PWNED"
    evil = {"x": {"_target_": "builtins.open", "file": str(marker), "mode": "w"}}
    (tmp_path / "configs" / "experiment").mkdir(parents=True)
    text = "# @package _global_\n" + OmegaConf.to_yaml({"hydra": {"callbacks": evil}})
    (tmp_path / "configs" / "experiment" / "evil.yaml").write_text(text)
    args = ["--config-dir", str(tmp_path / "configs"), "experiment=evil", "hydra.run.dir=run"]
    result = run_main(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "hydra.callbacks.x._target_='builtins.open'" in result.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_partial_on_a_callback_is_a_clear_error(tmp_path):
    partial = [
        "+callbacks.p._target_=lightning.pytorch.callbacks.Timer",
        "+callbacks.p._partial_=true",
    ]
    result = run_main("debug=fast", "hydra.run.dir=run", *partial, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "callbacks.p._partial_: _partial_ is not supported here" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.rglob("*.ckpt"))


# ------------------------------------------------------------------ one URL parser
class Server:
    """A real HTTP server on a loopback address, counting the requests it sees."""

    def __init__(self, host: str, redirect: str | None = None):
        self.hits = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                server.hits.append(self.path)
                self.send_response(302 if redirect else 200)
                self.send_header("Location" if redirect else "Content-Length", redirect or "4")
                self.end_headers()
                self.wfile.write(b"" if redirect else b"book")

            def log_message(self, *_args):
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def other_host(monkeypatch):
    """127.0.0.2: a loopback address, so the test stays on this machine, but not one the check
    allows plain HTTP to (only 127.0.0.1 and localhost): it stands for a host elsewhere."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,127.0.0.2,localhost")
    server = Server("127.0.0.2")
    yield server
    server.close()


def test_a_url_that_parsers_read_differently_is_refused_before_any_request(tmp_path, other_host):
    url = f"http://127.0.0.2:{other_host.port}\\@localhost/book.txt"
    args = ["debug=fast", "hydra.run.dir=run", f"data.url={url}", f"paths.data_dir={tmp_path}/d"]
    result = run_main(*args, "data.path=null", "data.sha256=null", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"sent as 'http://127.0.0.2:{other_host.port}/%5C@localhost/book.txt'" in result.stderr
    assert "to host 127.0.0.2" in result.stderr and "Traceback" not in result.stderr
    assert other_host.hits == []  # no request reached the other host
    assert not (tmp_path / "d").exists()


def test_a_redirect_hop_that_parsers_read_differently_is_refused(tmp_path, other_host):
    hop = f"http://127.0.0.2:{other_host.port}\\@localhost/book.txt"
    mirror = Server("127.0.0.1", redirect=hop)
    try:
        with pytest.raises(ConfigError, match="a redirect from") as err:
            download(f"http://127.0.0.1:{mirror.port}/book.txt", tmp_path, "book.txt", None, 10)
    finally:
        mirror.close()
    assert "to host 127.0.0.2" in str(err.value)
    assert mirror.hits == ["/book.txt"] and other_host.hits == []
    assert list(tmp_path.iterdir()) == []  # neither the file nor a .part


def test_the_prepared_url_is_what_is_fetched(tmp_path, other_host):
    """The same server reached by a plain URL works (the test above fails for the parser alone)."""
    mirror = Server("127.0.0.1")
    try:
        got = download(
            f"http://LOCALHOST:{mirror.port}/a%20b/book.txt", tmp_path, "book.txt", None, 10
        )
    finally:
        mirror.close()
    assert got == tmp_path / hashlib.sha256(b"book").hexdigest() / "book.txt"
    assert got.read_bytes() == b"book"
    assert mirror.hits == ["/a%20b/book.txt"]


# ------------------------------------------------------------------ eval.json
def test_a_corrupt_eval_json_is_refused_before_the_evaluation_and_kept(finished, tmp_path):
    finished_run = own_copy(finished, tmp_path / "run")
    corrupt = finished_run / "eval.json"
    corrupt.write_text('{"best.ckpt": {"val_loss": 4.2')  # cut off mid-write
    before = corrupt.read_bytes()
    out = tmp_path / "out"
    args = [f"ckpt_path={finished_run}", f"output_dir={out}"]
    result = run_main(*args, cwd=tmp_path, tool="gptlab-eval")
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"'{corrupt}' is not gptlab-eval's JSON record" in result.stderr
    assert "Move it away" in result.stderr and "Traceback" not in result.stderr
    assert "val loss" not in result.stdout  # refused before the evaluation
    assert corrupt.read_bytes() == before
    assert not (out / "eval.json").exists()
    corrupt.unlink()  # the fix the message gives works
    check(run_main(*args, cwd=tmp_path, tool="gptlab-eval"))
    assert any(label.startswith("best.ckpt on") for label in json.loads(corrupt.read_text()))
