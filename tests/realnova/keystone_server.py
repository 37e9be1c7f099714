"""Real Keystone on 127.0.0.1, for the real-Nova lane: the ``keystone`` wheel, sqlite, fernet
tokens, in a process of its own.

Keystone imports eventlet, and Nova's fixtures refuse a process where eventlet is loaded, so
``KeystoneProcess`` (used by ``cloud.py``) runs it as a child: this file run as a script. The
parent makes the listening socket and hands it down, so the port is known before Keystone is,
and stays the same when Keystone is restarted with another configuration (a new token
lifetime): clients meanwhile wait in the socket's backlog instead of being refused.

The child sets Keystone up the way an operator does, once per folder: ``keystone-manage
db_sync``, ``fernet_setup``, ``credential_setup`` and ``bootstrap`` (user ``admin``, project
``admin``, the reader, member, manager, admin and service roles, the identity endpoints in
``region``). Then it serves ``keystone.server.wsgi.initialize_public_application()`` from a
threaded stdlib WSGI server. Keystone reads its configuration from ``OS_KEYSTONE_CONFIG_FILES``
and parses ``sys.argv``, which is cleared first.

Keystone's cache is on, in process memory, as production runs it (in memcached): without it
each token validation rebuilt the token from sqlite, some 120 ms, and with nova-api checking
every request's token a small server listing took 150 ms instead of 35. Keystone drops its
cached tokens whenever it records a revocation, so revoked tokens are still refused at once.

Only the standard library is imported at module level: ``cloud.py`` imports this module where
Keystone is not installed (the main test venv).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

logger = logging.getLogger("realnova.keystone")

HOST = "127.0.0.1"
# Keystone's own default: tokens live an hour unless a test asks for less.
DEFAULT_TOKEN_LIFETIME = 3600
# Keystone cuts a token's issue time to whole seconds: below 2 s a token may be born expired.
MIN_TOKEN_LIFETIME = 2
# Written once the folder is set up: a restart finds it and only serves.
_SET_UP_MARK = "set-up"
_SETUP_TIMEOUT = 120.0


def write_config(folder: Path, *, token_lifetime: int) -> Path:
    """keystone.conf in ``folder``: sqlite, fernet tokens living ``token_lifetime`` seconds,
    password hashes cheap enough for tests (bcrypt at 4 rounds: 0.08 s a password
    authentication instead of 0.4 s), the cache in process memory (see the module's
    docstring)."""
    if token_lifetime < MIN_TOKEN_LIFETIME:
        msg = f"token lifetime {token_lifetime} s: Keystone needs at least {MIN_TOKEN_LIFETIME}"
        raise ValueError(msg)
    keys = folder / "fernet-keys"
    text = f"""\
[DEFAULT]
log_file = {folder / "keystone.log"}

[database]
connection = sqlite:///{folder / "keystone.db"}

[token]
provider = fernet
expiration = {token_lifetime}

[fernet_tokens]
key_repository = {keys}

[fernet_receipts]
# fernet_setup also makes the receipts' keys; /etc/keystone/fernet-keys by default.
key_repository = {keys}

[credential]
key_repository = {folder / "credential-keys"}

[identity]
password_hash_rounds = 4
max_password_length = 72

[cache]
enabled = true
backend = dogpile.cache.memory
"""
    path = folder / "keystone.conf"
    path.write_text(text)
    return path


class KeystoneProcess:
    """Keystone in a child process, serving on a socket this object owns.

    ``start`` returns at once (the child sets Keystone up, some 7 s the first time, then
    serves); ``wait_ready`` waits until it answers. ``restart`` serves the same folder, so the
    same users, keys and tokens, with another token lifetime."""

    def __init__(
        self,
        folder: Path,
        *,
        admin_password: str,
        region: str,
        port: int = 0,
        python: str = sys.executable,
        token_lifetime: int = DEFAULT_TOKEN_LIFETIME,
    ) -> None:
        self.folder = folder
        self.admin_password = admin_password
        self.region = region
        self.python = python
        self.token_lifetime = token_lifetime
        self._requested_port = port
        self._socket: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        self.wait_ready()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._socket is None:
            raise RuntimeError("Keystone is not started")
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def auth_url(self) -> str:
        return f"{self.url}/v3"

    @property
    def log_path(self) -> Path:
        return self.folder / "keystone.log"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._socket is None:
            self._socket = socket.create_server((HOST, self._requested_port), backlog=128)
            self._socket.set_inheritable(True)
        write_config(self.folder, token_lifetime=self.token_lifetime)
        command = [
            self.python,
            str(Path(__file__).resolve()),
            "--folder",
            str(self.folder),
            "--fd",
            str(self._socket.fileno()),
            "--admin-password",
            self.admin_password,
            "--region",
            self.region,
            "--parent-pid",
            str(os.getpid()),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
        with (self.folder / "keystone.stderr").open("ab") as stderr:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                pass_fds=(self._socket.fileno(),),
                env=env,
            )

    def wait_ready(self, timeout: float = _SETUP_TIMEOUT) -> None:
        """Until Keystone answers its version document."""
        deadline = time.monotonic() + timeout
        while True:
            process = self._process
            if process is None or process.poll() is not None:
                raise RuntimeError(f"Keystone stopped before it answered:\n{self.output_tail()}")
            try:
                with urllib.request.urlopen(self.auth_url, timeout=5) as answer:  # noqa: S310
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Keystone did not answer in {timeout} s:\n{self.output_tail()}")
            time.sleep(0.2)

    def restart(self, *, token_lifetime: int) -> None:
        """The same Keystone (folder, keys, port) with another ``[token] expiration``, the way
        an operator changes it. Tokens already issued keep the expiry they were issued with."""
        self._stop_child()
        self.token_lifetime = token_lifetime
        self.start()
        self.wait_ready()

    def stop(self) -> None:
        self._stop_child()
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _stop_child(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def output_tail(self, characters: int = 3000) -> str:
        texts = []
        for path in (self.folder / "keystone.stderr", self.log_path):
            with contextlib.suppress(OSError):
                texts.append(f"{path.name}: {path.read_text(errors='replace')[-characters:]}")
        return "\n".join(texts)


# ================================================================================================
# python keystone_server.py: the child
# ================================================================================================


def _keystone_manage(config: Path, *arguments: str) -> subprocess.Popen[bytes]:
    """``keystone-manage`` of this interpreter's environment, as an operator runs it."""
    script = Path(sys.executable).with_name("keystone-manage")
    return subprocess.Popen(
        [str(script), "--config-file", str(config), *arguments], stdin=subprocess.DEVNULL
    )


def _wait_all(processes: list[subprocess.Popen[bytes]], what: str) -> None:
    for process in processes:
        code = process.wait(timeout=_SETUP_TIMEOUT)
        if code:
            msg = f"keystone-manage {what} failed with exit code {code}"
            raise RuntimeError(msg)


def _set_up(folder: Path, config: Path, *, public_url: str, password: str, region: str) -> None:
    """The database, the keys and the first admin, once per folder."""
    if (folder / _SET_UP_MARK).exists():
        return
    started = time.monotonic()
    user = ["--keystone-user", str(os.getuid()), "--keystone-group", str(os.getgid())]
    # The keys do not need the database: made while it migrates (two cores, three processes).
    _wait_all(
        [
            _keystone_manage(config, "db_sync"),
            _keystone_manage(config, "fernet_setup", *user),
            _keystone_manage(config, "credential_setup", *user),
        ],
        "db_sync, fernet_setup or credential_setup",
    )
    for keys in ("fernet-keys", "credential-keys"):
        (folder / keys).chmod(0o700)
    urls = [f"--bootstrap-{kind}-url={public_url}" for kind in ("admin", "public", "internal")]
    _wait_all(
        [
            _keystone_manage(
                config,
                "bootstrap",
                f"--bootstrap-password={password}",
                *urls,
                f"--bootstrap-region-id={region}",
            )
        ],
        "bootstrap",
    )
    (folder / _SET_UP_MARK).write_text(f"{time.monotonic() - started:.1f} s\n")


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        logger.debug("%s %s", self.address_string(), format % args)


class _InheritedSocketServer(socketserver.ThreadingMixIn, WSGIServer):
    """A threaded WSGI server on a socket already bound and listening (the parent's)."""

    daemon_threads = True

    def __init__(self, listening: socket.socket) -> None:
        super().__init__(listening.getsockname()[:2], _QuietHandler, bind_and_activate=False)
        self.socket.close()
        self.socket = listening
        self.server_address = listening.getsockname()[:2]
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]
        self.setup_environ()


def _serve(folder: Path, listening: socket.socket, parent_pid: int | None) -> None:
    os.environ["OS_KEYSTONE_CONFIG_FILES"] = str(folder / "keystone.conf")
    sys.argv = sys.argv[:1]  # Keystone parses the command line as its own
    from keystone.server import wsgi  # noqa: PLC0415 - imports eventlet: the child only

    application = wsgi.initialize_public_application()
    server = _InheritedSocketServer(listening)
    server.set_app(application)
    stop = threading.Event()

    def handle(signum: int, frame: Any) -> None:
        del signum, frame
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    thread = threading.Thread(
        target=server.serve_forever, name="keystone-http", kwargs={"poll_interval": 0.2}
    )
    thread.daemon = True
    thread.start()
    while not stop.wait(0.5):
        if parent_pid and os.getppid() != parent_pid:
            break  # whoever started us is gone
    server.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="realnova-keystone", description=__doc__)
    parser.add_argument("--folder", type=Path, required=True, help="with keystone.conf")
    parser.add_argument("--fd", type=int, required=True, help="a listening socket to serve on")
    parser.add_argument("--admin-password", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--parent-pid", type=int)
    args = parser.parse_args(argv)
    listening = socket.socket(fileno=args.fd)
    host, port = listening.getsockname()[:2]
    _set_up(
        args.folder,
        args.folder / "keystone.conf",
        public_url=f"http://{host}:{port}/v3",
        password=args.admin_password,
        region=args.region,
    )
    _serve(args.folder, listening, args.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
