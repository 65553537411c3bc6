import numpy as np
import pytest


@pytest.fixture
def rng():
    # Fresh inputs per test, from a fixed seed so failures reproduce.
    return np.random.default_rng(20261201)
