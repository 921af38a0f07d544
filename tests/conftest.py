import pytest

from tests.frameworks import FRAMEWORKS


@pytest.fixture(params=list(FRAMEWORKS), ids=list(FRAMEWORKS))
def fw(request):
    """Each of the three implementations in turn, behind a NumPy-in, NumPy-out adapter."""
    return FRAMEWORKS[request.param]
