"""python -m treeflash.bench.structured at a tiny setting: it writes its JSON, and the constrained outputs
of plain decoding and of the drafter agree."""

import json

import pytest

from treeflash.bench import structured


@pytest.mark.slow
def test_structured_bench_writes_identical_outputs(tmp_path):
    out = tmp_path / "structured.json"
    assert structured.main(["--schemas", "1", "--max-tokens", "16", "--threads", "1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["all_identical"] and r["rows"][0]["draft"]["ngram"]["identical"]
    assert r["mask_us"]["count"] > 0 and r["machine"]["cpu_cores"] >= 1


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        structured.main(["--help"])
    assert "python -m treeflash.bench.structured --out" in capsys.readouterr().out
