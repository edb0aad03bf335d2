"""tests/compat: torch.fx's real clients (torchvision, timm) run on fxloom; skipped, saying
so, where torchvision or timm is not installed (`make setup` puts them in .venv/compat-packages:
pyproject.toml's compat extra pins them)."""

import pytest

from tests.compat.clients import compat_packages_off_path


@pytest.fixture(autouse=True)
def _compat_packages_for_this_test_only():
    """Each compat test puts the compat packages on ``sys.path`` as it imports them; this takes
    them off afterwards, since processes later tests spawn inherit the path (transformers there
    would find torchvision and fail to import it)."""
    yield
    compat_packages_off_path()
