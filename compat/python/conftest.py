"""Starts the real streamgate binary for the Python SDK suite.

The binary comes from STREAMGATE_BIN (the test script builds it); each test gets a fresh
server on a free port with its own data directory.
"""

import os
import subprocess
import tempfile
import threading

import pytest


@pytest.fixture
def endpoint():
    binary = os.environ.get("STREAMGATE_BIN")
    if not binary or not os.path.exists(binary):
        pytest.fail("set STREAMGATE_BIN to a built streamgate binary (scripts/test.sh does)")
    with tempfile.TemporaryDirectory() as data_dir:
        proc = subprocess.Popen(
            [binary, "--data-dir", data_dir, "--listen", "127.0.0.1:0", "--reap-interval-secs", "1"],
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
        )
        found = threading.Event()
        address = {}

        def watch():
            for line in proc.stdout:
                if " listening on " in line and not found.is_set():
                    address["url"] = line.split(" listening on ", 1)[1].strip()
                    found.set()

        threading.Thread(target=watch, daemon=True).start()
        if not found.wait(60):
            proc.kill()
            pytest.fail("streamgate did not report its address")
        try:
            yield address["url"]
        finally:
            proc.kill()
            proc.wait()
