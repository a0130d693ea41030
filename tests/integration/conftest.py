"""Helpers for tests that start a real Ray cluster on this machine."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short folder for Ray's files (unix socket paths must stay under ~100 characters)."""
    return tmp_path_factory.mktemp("rs")


@pytest.fixture(scope="module")
def port() -> int:
    """A free port for one module's cluster."""
    return free_port()
