import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)  # tiny test models: one thread beats two (and CI shares its 2 cores)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
