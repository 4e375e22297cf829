"""Shared fixtures of the Python binding tests (they run against the installed package)."""
import numpy as np
import pytest

import shardadam


def pytest_report_header(config):
    return [f"shardadam {shardadam.__version__} from {shardadam.__file__}", shardadam.build_info()]


@pytest.fixture
def rng():
    """A seeded generator: every test's data is random but reproducible."""
    return np.random.default_rng(20261130)
