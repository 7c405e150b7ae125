import pytest
import torch

# The repository root, tests/ and benchmarks/ are importable through setup.cfg's [tool:pytest] pythonpath.
pytest_plugins = ["strict_skips"]

# The test machine has very few cores shared with other jobs: keep PyTorch single-threaded.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
