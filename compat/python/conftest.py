"""Starts the real streamgate binary for the client suites.

The binary comes from STREAMGATE_BIN (the test script builds it); each test gets a fresh
server on free ports with its own data directory.
"""

import contextlib
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass

import pytest


# The root access token every test server is started with (`--root-token`).
ROOT_TOKEN = "streamgate-test-root-token-0123456789"


@dataclass
class Streamgate:
    endpoint: str
    resp_port: int
    token: str = ROOT_TOKEN


@contextlib.contextmanager
def launch(*extra_args, data_dir=None):
    """Runs streamgate with `extra_args` until the block ends (then kills it with SIGKILL).

    With `data_dir`, the server keeps its data there, so a later launch on the same
    directory restarts it; otherwise it gets a temporary directory of its own.
    """
    binary = os.environ.get("STREAMGATE_BIN")
    if not binary or not os.path.exists(binary):
        pytest.fail("set STREAMGATE_BIN to a built streamgate binary (scripts/test.sh does)")
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory())
        proc = subprocess.Popen(
            [binary, "--data-dir", data_dir, "--listen", "127.0.0.1:0", "--resp-listen", "127.0.0.1:0",
             "--reap-interval-secs", "1", "--compaction-interval-ms", "300", "--root-token", ROOT_TOKEN,
             *extra_args],
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            env=dict(os.environ, STREAMGATE_LOG="warn"),
        )
        ready = threading.Event()
        found = {}

        def watch():
            # The banner names the HTTP endpoint, then RESP, and ends with the s2 CLI lines.
            for line in proc.stdout:
                if " listening on " in line:
                    found["endpoint"] = line.split(" listening on ", 1)[1].strip()
                elif line.strip().startswith("RESP:"):
                    found["resp_port"] = int(line.split()[1].rsplit(":", 1)[1])
                elif line.startswith("Point the s2 CLI"):
                    ready.set()

        threading.Thread(target=watch, daemon=True).start()
        if not ready.wait(60):
            proc.kill()
            pytest.fail("streamgate did not report its addresses")
        try:
            yield Streamgate(found["endpoint"], found["resp_port"])
        finally:
            proc.kill()
            proc.wait()


@pytest.fixture
def server():
    with launch() as running:
        yield running


@pytest.fixture
def endpoint(server):
    return server.endpoint
