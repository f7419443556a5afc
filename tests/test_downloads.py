"""Downloads: one URL parser decides what is checked and what is fetched (gptlab.data.corpus),
so an address that parsers read differently never reaches another host."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import run_main

from gptlab.data.corpus import download
from gptlab.errors import ConfigError


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
    assert list(tmp_path.iterdir()) == []  # neither the file nor a temporary one


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
