"""Start a server in this process on a free local port (tests, the sweep, the lesson).

    with running_server(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']) as url:
        OpenAI(base_url=url + "/v1", api_key="EMPTY").completions.create(...)

uvicorn runs in a background thread on a socket bound here first (port 0: the OS picks a free
port, so there is no race between choosing a port and binding it).
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from contextlib import contextmanager


@contextmanager
def running_server(argv: list[str] | None = None, host: str = "127.0.0.1"):
    """Yields the base URL (http://host:port) of a `speclab serve` started with these flags."""
    import uvicorn

    from speclab.serve.cli import add_serve_args, build_server

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    args = parser.parse_args(argv or [])
    server, app = build_server(args)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, lifespan="on"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start (see the log above)")
        time.sleep(0.02)
    try:
        url = f"http://{host}:{port}"
        url_server = _UrlWithServer(url)
        url_server.server = server
        yield url_server
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        sock.close()


class _UrlWithServer(str):
    """The base URL, carrying the in-process Server as `.server` (for tests that inspect the engine)."""

    server = None
