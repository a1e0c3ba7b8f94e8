"""Shared test settings.

The tests run many small torch ops on a 2-core machine that other jobs share. There, torch's
OpenMP pool spin-waits against the other processes and makes each op several times slower
(measured: SmolLM2-135M plain decoding 2.3 s with one thread vs 21-25 s with the default two
under load), so every test runs with one intra-op thread. Set SPECDRAFT_TEST_THREADS to override.
"""
from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("SPECDRAFT_TEST_THREADS", "1")))
    try:
        yield
    finally:
        torch.set_num_threads(before)
