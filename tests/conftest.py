"""Fixtures shared by test modules (opt in with ``pytestmark = pytest.mark.usefixtures(...)``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: two-thread ops stall for milliseconds when another process holds a
    core, and what is measured (times, eager peaks) then depends on the neighbours."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
