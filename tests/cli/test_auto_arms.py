"""--auto-arms: the budgets --budget auto's bandit chooses among, validated with the flag named."""

import pytest

from treeflash.cli.common import parse_bandit
from treeflash.errors import InvalidRequestError


def test_arms_reach_the_bandit_config():
    assert parse_bandit("0,8,32").arms == (0, 8, 32)
    assert parse_bandit(None).arms == (0, 4, 8, 16, 32, 48, 64)


@pytest.mark.parametrize("bad", ["8,32", "0,x", "0,4,4", "0,-4"])
def test_bad_arms_name_the_flag(bad):
    with pytest.raises(InvalidRequestError) as e:
        parse_bandit(bad)
    assert "--auto-arms" in str(e.value) and e.value.param == "auto_arms"
