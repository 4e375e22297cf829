"""Shared fixtures of the Python binding tests (they run against the installed package)."""
import os

# Under pytest-xdist the workers share the cores with each other and with the ranks their
# tests start. torch's intra-op pool (OpenMP threads that spin while they wait) in every one
# of them oversubscribed a 2-core CI machine: the whole suite took 191 s on 2 workers, 125 s
# with one such thread each. Set before anything loads OpenMP (numpy, torch); the ranks
# inherit it. shardadam's own threads are not OpenMP's and do not read it.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest

import shardadam


def pytest_report_header(config):
    return [f"shardadam {shardadam.__version__} from {shardadam.__file__}", shardadam.build_info()]


@pytest.fixture
def rng():
    """A seeded generator: every test's data is random but reproducible."""
    return np.random.default_rng(20261130)
