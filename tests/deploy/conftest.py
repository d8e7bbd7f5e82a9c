import pytest

from tests.deploy.wheel import build_wheel


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """treeflash's wheel, built once per session from a copy of the sources."""
    return build_wheel(tmp_path_factory.mktemp("build"))
