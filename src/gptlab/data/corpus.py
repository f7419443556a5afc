"""Find, download and verify the raw text corpus. The cache is content-addressed,
`<data dir>/sha256/<its sha256>/<file name>`: no config can change a file another run reads. A file
placed by hand is used when its content is the expected one; nothing is written into the data
directory unless a download is needed (docs/security.md)."""

import contextlib
import hashlib
import logging
import os
import shutil
import socket
from pathlib import Path
from urllib.parse import unquote, urljoin

import requests
from tqdm.auto import tqdm
from urllib3.util import parse_url

from gptlab.errors import ConfigError
from gptlab.reader import sha256_of

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "[::1]"}  # as urllib3 writes hosts
MAX_REDIRECTS = 10
CHUNK = 1 << 16
DOWNLOADS = "sha256"  # <data dir>/sha256/<digest>/<name>: each content under a name of its own


def resolve_corpus(
    url: str | None,
    path: str | None,
    sha256: str | None,
    data_dir: str | Path,
    timeout: float = 30.0,
    file_name: str | None = None,
) -> Path:
    """Return the path of a verified corpus file: `path` if given, else the download of `url`,
    found or saved under `file_name` (else the URL's own file name)."""
    if path:
        corpus = Path(path).expanduser()
        if not corpus.is_file():
            raise ConfigError(
                f"data.path: no file at '{corpus}'. Check the path (relative paths are taken "
                f"from '{Path.cwd()}') or unset data.path to download data.url."
            )
        if sha256 and sha256_of(corpus) != sha256:
            raise ConfigError(
                f"data.sha256: '{corpus}' does not have the expected sha256 {sha256}, the "
                "corpus's (data.path without data=text_file keeps the corpus's checksum). For a "
                "text of your own give data=text_file data.path=<file>; for the corpus, the "
                "right file; or set data.sha256=null to skip the check."
            )
        return corpus
    if not url:
        raise ConfigError("data.url and data.path are both empty: set one of them.")

    if file_name is not None and (Path(file_name).name != file_name or file_name in (".", "..")):
        raise ConfigError(
            f"data.file_name={file_name!r}: give a bare file name (no folder), the name the "
            "download is found or saved under in the data directory."
        )
    name = file_name or Path(unquote(parse_url(prepared_url(url)).path or "")).name or "corpus.txt"
    data_dir = Path(data_dir).expanduser()
    placed = data_dir / name  # put there by hand (a read-only mount, a copy)
    stored = data_dir / DOWNLOADS / (sha256 or "") / name  # a download: only with its sha256
    candidates = [placed]
    if sha256:
        candidates.append(stored)
    for found in candidates:
        if found.is_file() and (sha256 is None or sha256_of(found) == sha256):
            log.info("Corpus found at %s", found)
            return found
    return download(url, data_dir / DOWNLOADS, name, sha256, timeout=timeout)


def prepared_url(url: str) -> str:
    """`url` as requests sends it, so the check and the download cannot read it differently."""
    request = requests.models.PreparedRequest()
    try:
        request.prepare_url(url, None)
    except requests.RequestException as e:
        raise ConfigError(
            f"data.url: '{url}' is not a valid URL ({e}). Fix it, or set data.path to a local file."
        ) from None
    return request.url


def check_url(url: str, redirected_from: str | None = None) -> str:
    """Only HTTPS, or plain HTTP to this machine (mirrors, tests); returns the URL to fetch."""
    prepared = prepared_url(url)
    parsed = parse_url(prepared)
    if parsed.scheme == "https" or (parsed.scheme == "http" and parsed.host in LOOPBACK_HOSTS):
        return prepared
    via = f" (a redirect from '{redirected_from}')" if redirected_from else ""
    sent = f", sent as '{prepared}' to host {parsed.host}," if prepared != url else ""
    raise ConfigError(
        f"data.url: '{url}'{via}{sent} is not an https:// address. Downloads go over HTTPS only "
        "(plain http is allowed to 127.0.0.1/localhost); fix the URL or set data.path to a "
        "local file."
    )


def get_checked(url: str, timeout: float) -> requests.Response:
    """GET `url`, following redirects here: each hop is checked before it is fetched."""
    current = check_url(url)
    for _ in range(MAX_REDIRECTS):
        response = requests.get(current, stream=True, timeout=timeout, allow_redirects=False)
        if not response.is_redirect:
            return response
        response.close()
        hop = urljoin(current, response.headers["location"])
        current = check_url(hop, redirected_from=current)
    raise ConfigError(
        f"data.url: '{url}' redirects more than {MAX_REDIRECTS} times. Give the final address, "
        "or set data.path to a local file."
    )


def gone(pid: str) -> bool:
    """Whether process `pid` has ended; False for no number, or another user's live process."""
    try:
        os.kill(int(pid), 0)  # signal 0 only asks whether it exists
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError):
        pass
    return False


def temporary(path: Path) -> Path:
    """Where `path` (a name without dots) is made, named by its host and process (remove_stale)."""
    return path.parent / f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp"


def remove_stale(folder: Path) -> None:
    """Remove what processes on this host left in `folder` (temporary) once they are gone."""
    host = socket.gethostname()
    for tmp in Path(folder).glob(".*.tmp"):
        parts = tmp.name[1 : -len(".tmp")].split(".", 1)
        where, _, pid = parts[-1].rpartition(".")
        if len(parts) == 2 and where == host and gone(pid):
            with contextlib.suppress(OSError):  # a read-only data directory keeps it
                if tmp.is_dir():
                    shutil.rmtree(tmp)
                else:
                    tmp.unlink()
                log.info("Removed %s, left by a process that was killed", tmp)


def download(url: str, folder: Path, name: str, sha256: str | None, timeout: float = 30.0) -> Path:
    """Stream `url` to `folder/<its sha256>/<name>`, renamed into place once whole and checked."""
    check_url(url)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"paths.data_dir: cannot create '{folder}' ({e.strerror}). Point "
            "paths.data_dir (or GPTLAB_DATA_DIR) at a writable folder, or set data.path to a "
            "local copy."
        ) from e
    remove_stale(folder)
    tmp = temporary(folder / "download")
    log.info("Downloading %s to %s", url, folder)
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, get_checked(url, timeout) as response:
            response.raise_for_status()
            total = int(response.headers.get("content-length", 0)) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=name) as bar:
                for chunk in response.iter_content(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        if sha256 is not None and digest.hexdigest() != sha256:
            raise ConfigError(
                f"data.sha256: the file downloaded from {url} has sha256 {digest.hexdigest()}, "
                f"expected {sha256}. Nothing was saved. Check data.url, or set "
                "data.sha256=null if the file is meant to change."
            )
        target = folder / digest.hexdigest() / name
        target.parent.mkdir(exist_ok=True)
        os.replace(tmp, target)
        log.info("Saved %s", target)
        return target
    except requests.RequestException as e:
        raise ConfigError(
            f"Could not download the corpus from {url} to {folder}: {e.__class__.__name__}. "
            f"Without a network, place the file as {folder.parent / name} or set data.path to a "
            "local copy."
        ) from e
    finally:
        tmp.unlink(missing_ok=True)
