"""`treeflash bench` end to end on the toy model: JSON with the summary fields, table, plot, sweep, rerun."""

import json

import pytest

import treeflash.cli.bench as bench_cli
from tests.engine.toy import toy_loaded
from treeflash.bench import machine
from treeflash.cli.main import main


@pytest.fixture
def toy(monkeypatch, tmp_path):
    loaded = toy_loaded()
    monkeypatch.setattr(bench_cli, "load", lambda args: loaded)
    monkeypatch.setattr(machine, "bandwidth_gbs", lambda device, **kw: 10.0)  # no 128 MiB copy in tests
    prompts = tmp_path / "p.txt"
    prompts.write_text("abc abc abc abc\nthe cat the cat the\n", encoding="utf-8")
    return str(prompts)


def test_baseline_run_writes_json_table_and_plot(toy, tmp_path, capsys):
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    rc = main(["bench", "--prompts", toy, "--runs", "2", "--max-tokens", "8", "--ignore-eos", "--draft", "ngram",
               "--num-draft", "3", "--baseline", "ar", "--json", str(out), "--plot", str(png), "--quiet"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "decode tok/s" in table and "ngram num_draft=3" in table
    doc = json.loads(out.read_text())
    s = doc["summary"]
    for key in ("tokens_per_second", "tau", "speedup_vs_baseline", "e2e_tokens_per_second", "ttft_s"):
        assert isinstance(s[key], float), key
    assert s["outputs_identical"] is True and s["baseline"] == "ar"
    ngram = s["configs"][1]
    assert ngram["tokens_per_cpu_second"]["n"] == 2 and ngram["cpu_speedup_vs_baseline"]["mean"] > 0
    assert ngram["acceptance_per_depth"] and abs(sum(ngram["time_split"].values()) - 1) < 1e-3
    assert len(doc["runs"]) == 2 * 2 * 2 and {r["target"] for r in doc["runs"]} == {"ar", "ngram num_draft=3"}
    assert all(r["completion_tokens"] == 8 for r in doc["runs"])
    assert doc["versions"]["torch"] and doc["machine"]["cpu_cores"] and "gpu" in doc["machine"]
    assert doc["model"]["ar_bound_tokens_per_second"] > 0
    memory = doc["memory"]  # the plan of the model the flags name (the default; the toy replaces only the loading)
    assert memory["engines"] == 2 and memory["measured_max_reserved_bytes"] is None  # measured on CUDA only
    assert memory["planned_total_bytes"] == sum(memory["planned"].values()) and memory["planned"]["kv cache K"] > 0
    assert doc["collapse_warnings"] == [] or all("drop" in w for w in doc["collapse_warnings"])
    assert png.stat().st_size > 1000

    # --rerun repeats the measurement from the JSON's configuration and prompts
    again = tmp_path / "again.json"
    assert main(["bench", "--rerun", str(out), "--json", str(again), "--quiet"]) == 0
    doc2 = json.loads(again.read_text())
    assert doc2["config"]["args"] == doc["config"]["args"] and doc2["prompts"] == doc["prompts"]
    assert [r["output_sha1"] for r in doc2["runs"]] == [r["output_sha1"] for r in doc["runs"]]


def test_sweep_table_plot_and_json(toy, tmp_path, capsys):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    rc = main(["bench", "--prompts", toy, "--num-prompts", "1", "--runs", "1", "--max-tokens", "10", "--ignore-eos",
               "--draft", "ngram", "--sweep", "num_draft=2,4", "--baseline", "ar", "--warmup", "0",
               "--json", str(out), "--plot", str(png), "--quiet"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "ngram num_draft=2" in table and "ngram num_draft=4" in table
    s = json.loads(out.read_text())["summary"]
    assert [c.get("sweep_value") for c in s["configs"]] == [None, 2, 4]
    assert s["best_sweep_value"] in (2, 4) and s["speedup_vs_baseline"] > 0
    assert png.stat().st_size > 1000


def test_bad_flags_are_clear_errors(toy, capsys):
    assert main(["bench", "--prompts", toy, "--baseline", "ar"]) == 2  # no --draft
    assert "add --draft" in capsys.readouterr().err
    assert main(["bench", "--prompts", toy, "--draft", "ngram", "--sweep", "depth=1,2"]) == 2
    assert "KEY=v1,v2" in capsys.readouterr().err


def test_in_process_next_to_an_endpoint(toy, server, tmp_path):
    out = tmp_path / "m.json"
    rc = main(["bench", "--prompts", toy, "--num-prompts", "1", "--runs", "2", "--max-tokens", "6", "--ignore-eos",
               "--draft", "ngram", "--baseline", server, "--warmup", "0", "--json", str(out), "--quiet"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert [t["kind"] for t in doc["config"]["targets"]] == ["endpoint", "in-process"]
    s = doc["summary"]
    assert s["baseline"] == "endpoint" and s["speedup_vs_baseline"] > 0 and s["outputs_identical"] is None
