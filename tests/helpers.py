"""Running gptlab's console scripts as a user would: a real process in a chosen directory, or
the same entry point in this process where the test is not about the process."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path

BIN = Path(sys.executable).parent


def run_cli(
    *args: str, cwd: Path, tool: str = "gptlab-train", timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `tool args...` in `cwd`; one torch thread so parallel runs do not fight over 2 cores."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [str(BIN / tool), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_main(
    *args: str, cwd: Path, tool: str = "gptlab-train", env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the console script `tool`'s entry point in this process, as `run_cli` does in a new
    one: the same argv, directory, exit code, stdout and stderr, and one torch thread, without the
    seconds a new interpreter takes to import torch and Lightning (most of a debug run's). For any
    command line but one whose test is about the process itself: a signal, a kill, DDP's ranks,
    or what a process sets up at its start."""
    import torch

    [script] = entry_points(group="console_scripts", name=tool)
    main = script.load()
    out = io.StringIO()
    err = io.StringIO()
    with process_state(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.environ.update(env or {})
        torch.set_num_threads(1)  # as run_cli's OMP_NUM_THREADS=1 (process_state restores it)
        os.chdir(cwd)
        sys.argv = [tool, *args]
        try:
            code = main()  # as the console script's sys.exit(main())
        except SystemExit as e:
            code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("a message"): printed, exit 1
        code = 1
    return subprocess.CompletedProcess([tool, *args], code, out.getvalue(), err.getvalue())


def train_without_torch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """gptlab-train's entry point in a new interpreter whose stdout is its exit code, then which
    of torch and Lightning it loaded (`2\n[]\n`: bad input said before the heavy imports)."""
    code = (
        f"import sys; sys.argv = {['gptlab-train', *args]!r}\n"
        "from gptlab.cli.train import main\n"
        "try: main()\n"
        "except SystemExit as e: print(e.code)\n"
        "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd)


@contextlib.contextmanager
def process_state():
    """What a tool changes in its process, put back afterwards: the environment, argv, the
    working directory, the root logger (Hydra's job logging), warning filters, Hydra's global
    state and job config, torch's thread count and its deterministic-algorithms switch, and
    W&B's session (logger=wandb)."""
    import torch
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from gptlab.config.resolvers import start_subdir_of
    from gptlab.run.place import PLACE

    saved_env = dict(os.environ)
    saved_argv = sys.argv
    saved_cwd = Path.cwd()
    root = logging.getLogger()
    saved_handlers = root.handlers[:]
    saved_level = root.level
    saved_hydra_config = HydraConfig.instance().cfg
    saved_threads = torch.get_num_threads()  # num_threads is set before a data file is checked
    saved_deterministic = torch.are_deterministic_algorithms_enabled()  # trainer.deterministic
    saved_place = dict(vars(PLACE))  # this test's places: a tool run admits its own
    PLACE.__init__()
    GlobalHydra.instance().clear()
    start_subdir_of.cache_clear()  # where a start saves its config: one per start
    try:
        with warnings.catch_warnings():
            yield
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = saved_hydra_config  # --help and --cfg set it too
        torch.set_num_threads(saved_threads)
        torch.use_deterministic_algorithms(saved_deterministic)
        vars(PLACE).update(saved_place)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for handler in set(root.handlers) - set(saved_handlers):
            handler.close()  # the run's train.log
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        if "wandb" in sys.modules:  # W&B reads its settings (WANDB_MODE, the login) once, at
            sys.modules["wandb"].teardown()  # its setup: its public reset, for the next start


def check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (
        f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
    )
    return result


def read_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the one TensorBoard run under log_dir (a run's tensorboard/, whatever its
    run is named), as {tag: [(step, value)]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [run] = {path.parent for path in Path(log_dir).rglob("events.out.tfevents.*")} or {log_dir}
    # a run killed after its last save and resumed logs those steps twice: each step once here,
    # the value logged last (TensorBoard's own purge drops as many as the kill's timing left)
    acc = EventAccumulator(
        str(run), size_guidance={"scalars": 0, "tensors": 0}, purge_orphaned_data=False
    )
    acc.Reload()
    found = {}
    for tag in acc.Tags()["scalars"]:
        logged = sorted(acc.Scalars(tag), key=lambda e: e.wall_time)
        found[tag] = sorted({e.step: e.value for e in logged}.items())
    return found


def tensorboard_runs(log_dir: Path) -> list[str]:
    """The TensorBoard runs under log_dir as TensorBoard names them (folders of event files)."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    return sorted(EventMultiplexer().AddRunsFromDirectory(str(log_dir)).Runs())


@contextlib.contextmanager
def umask(mask: int):
    """This process's umask (and so that of the processes it starts) inside the block."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def own_copy(run_dir: Path, place: Path, kind: str = "run") -> Path:
    """A copy of an own run directory that is the user's own at its new place too: copied, then
    signed for that place with this session's key, as if gptlab had trained it there (a copy
    alone is foreign). Saves the tests a training run where the copy's place is not the point."""
    import shutil

    shutil.copytree(run_dir, place, symlinks=True)
    return sign_run(place, kind)


class LocalServer:
    """A real HTTP server on a loopback address and a free port: it serves `files` (path ->
    bytes), answers `redirects` (path -> location) with 302 and anything else with 404, and
    records every request path in `hits`, so a test sees any connection a tool opened."""

    def __init__(self, host: str = "127.0.0.1", files=None, redirects=None):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.files = dict(files or {})
        self.redirects = dict(redirects or {})
        self.hits: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                server.hits.append(self.path)
                if self.path in server.redirects:
                    self.send_response(302)
                    self.send_header("Location", server.redirects[self.path])
                    self.end_headers()
                    return
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_POST = do_PUT = do_DELETE = do_GET  # noqa: N815 - every method counts

            def log_message(self, *_args):
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.host = host
        self.port = self.httpd.server_address[1]
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def sign_run(run_dir: Path, kind: str = "run") -> Path:
    """A run directory made by hand signed as the user's own, as gptlab-train signs one when it
    makes it: its manifest.json, for its place, with this session's key."""
    import json

    from gptlab.run import ownership

    manifest = ownership.manifest(Path(run_dir).resolve(), kind)
    (Path(run_dir) / "manifest.json").write_text(json.dumps(manifest))
    return Path(run_dir)
