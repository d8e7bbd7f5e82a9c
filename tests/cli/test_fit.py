"""`treeflash fit` and planning at start: the table and JSON are the plan's, a configuration that does
not fit is refused before any weight is read (exit status 2, the table in the message), and
`--max-context auto` takes the largest context whose plan fits, 5% more being refused."""

import json
from pathlib import Path

import pytest

from tests.models.test_plan import DEFAULT_GGUF, default_gguf, needs_default  # noqa: F401 (default_gguf: the fixture needs_default uses)
from treeflash.cli.main import build_parser, main
from treeflash.cli.planning import GiB, MiB, PlanError, parse_memory, plan_at_start
from treeflash.errors import InvalidRequestError
from treeflash.models.memory import PlanRequest, plan_memory, read_header

pytestmark = needs_default
PART_NAMES = ("weights", "kv cache K", "kv cache V", "rope tables", "verify graphs", "graph workspace", "prefill workspace",
              "allocator slack", "cuda context")


def test_memory_sizes_and_card_names():
    assert parse_memory("24GiB") == 24 * GiB == parse_memory("rtx4090") == parse_memory("24g")
    assert parse_memory("24GB") == 24 * 10**9
    assert parse_memory("24000MiB") == 24000 * MiB
    assert parse_memory("h200") == 141 * GiB and parse_memory("auto") == "auto"
    for bad in ("24 parsecs", "-3GiB", "0", "rtx9999"):
        with pytest.raises(InvalidRequestError, match="--gpu-memory"):
            parse_memory(bad)


def test_fit_prints_every_part_and_writes_the_plan_as_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["fit", "--gpu-memory", "24GiB", "--cache-type-k", "q8_0", "--cache-type-v", "tq3_0", "--draft", "ngram",
               "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "fits: yes" in text
    for name in PART_NAMES:
        assert f"  {name} " in text
    assert "largest context that fits: 8192 tokens (the model's limit is 8192)" in text
    doc = json.loads(out.read_text())
    expected = plan_memory(read_header(DEFAULT_GGUF), PlanRequest(8192, cache_type_k="q8_0", cache_type_v="tq3_0", verify_nodes=6))
    assert doc["total_bytes"] == expected.total and doc["parts"] == {p.name: p.bytes for p in expected.parts}
    assert doc["fits"] is True and doc["available_bytes"] == 24 * GiB and doc["verify_nodes"] == 6
    assert f"{expected.total / MiB:.1f} MiB" in text


def test_fit_says_no_and_what_to_change(capsys):
    rc = main(["fit", "--gpu-memory", "1300MiB", "--max-context", "8192", "--weights", "float"])
    text = capsys.readouterr().out
    assert rc == 1 and "fits: NO" in text
    line = next(l for l in text.splitlines() if l.startswith("largest context that fits:"))
    n = int(line.split(":")[1].split()[0])
    assert 0 < n < 8192
    assert f"try: --max-context {n}" in text
    header = read_header(DEFAULT_GGUF)
    assert plan_memory(header, PlanRequest(n)).total <= 1300 * MiB < plan_memory(header, PlanRequest(n + 1)).total


def test_fit_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and "--gpu-memory rtx4090" in text


def _args(*flags):
    return build_parser().parse_args(["generate", *flags])


def test_auto_context_fits_and_five_percent_more_is_refused():
    start = plan_at_start(_args("--device", "cuda", "--gpu-memory", "1350MiB", "--max-context", "auto", "--draft", "ngram", "--weights", "float"))
    n = start.max_context
    assert 0 < n < 8192 and start.plan.total <= 1350 * MiB and start.verify_nodes == 6
    with pytest.raises(PlanError) as e:
        plan_at_start(_args("--device", "cuda", "--gpu-memory", "1350MiB", "--max-context", str(int(n * 1.05)), "--draft", "ngram", "--weights", "float"))
    assert "does not fit" in str(e.value) and "fits: NO" in str(e.value) and f"try: --max-context {n}" in str(e.value)


def test_generate_refuses_before_loading_weights(monkeypatch, capsys):
    import treeflash.models.loader as loader

    def no_load(*a, **k):
        raise AssertionError("weights were read")

    monkeypatch.setattr(loader, "load_model", no_load)
    rc = main(["generate", "--device", "cpu", "--gpu-memory", "300MiB", "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "treeflash generate: error: the configuration does not fit in memory; nothing was loaded" in err
    assert "kv cache K" in err and "fits: NO" in err


def test_cpu_auto_context_is_capped_by_the_model_and_says_so():
    start = plan_at_start(_args("--device", "cpu", "--max-context", "auto"))
    assert start.max_context <= 8192
    assert start.plan.part("cuda context") == 0 and start.plan.part("verify graphs") == 0


def test_bad_max_context_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--max-context", "lots"])
    assert "--max-context" in capsys.readouterr().err


def test_weights_auto_keeps_gguf_blocks_only_when_the_dequantized_weights_do_not_fit():
    from treeflash.models.memory import PlanRequest

    header = read_header(DEFAULT_GGUF)
    native = plan_memory(header, PlanRequest(8192, weights="native", verify_nodes=6)).total
    dense = plan_memory(header, PlanRequest(8192, weights="float", verify_nodes=6)).total
    assert native < dense  # the default model's Q4_1 blocks are smaller than bf16
    roomy = plan_at_start(_args("--device", "cuda", "--gpu-memory", "24GiB", "--draft", "ngram"))
    assert roomy.weights == "float" and "weights float (--weights auto)" in roomy.summary
    between = f"{(native + dense) // 2 // MiB}MiB"
    tight = plan_at_start(_args("--device", "cuda", "--gpu-memory", between, "--draft", "ngram"))
    assert tight.weights == "native" and tight.plan.request.weights == "native" and tight.plan.total <= (native + dense) // 2
    cpu = plan_at_start(_args("--device", "cpu", "--gpu-memory", between, "--draft", "ngram", "--max-context", "1024"))
    assert cpu.weights == "float"  # the CPU keeps its own choice (float unless --weights int4 / native)
    explicit = plan_at_start(_args("--device", "cuda", "--gpu-memory", "24GiB", "--weights", "native", "--draft", "ngram"))
    assert explicit.weights == "native"


def test_prefill_chunk_auto_takes_the_largest_chunk_that_fits_beside_a_drafter():
    from treeflash.spec.drafter_memory import drafter_shape

    header = read_header(DEFAULT_GGUF)
    ngram = drafter_shape("ngram", None, header, 2)
    at = {c: plan_memory(header, PlanRequest(8192, weights="float", verify_nodes=6, prefill_chunk=c), ngram).total for c in (2048, 1024, 512)}
    assert at[2048] > at[1024] > at[512]
    between = f"{(at[1024] + at[512]) // 2 // MiB}MiB"  # 512 fits, 1024 does not
    flags = ("--device", "cuda", "--gpu-memory", between, "--weights", "float", "--draft", "ngram")
    start = plan_at_start(_args(*flags))
    assert start.prefill_chunk == 512 == start.plan.request.prefill_chunk
    assert "prefill in 512-token chunks" in start.summary
    assert plan_at_start(_args("--device", "cuda", "--gpu-memory", "24GiB", "--weights", "float", "--draft", "ngram")).prefill_chunk == 2048
    with pytest.raises(PlanError):  # an explicit chunk is kept, fits or not
        plan_at_start(_args(*flags, "--prefill-chunk", "2048"))
    with pytest.raises(PlanError):  # without a drafter the default chunk stays (--max-context auto then stays exact)
        plan_at_start(_args(*flags[:-2]))
    fixed = plan_at_start(_args("--device", "cuda", "--gpu-memory", "24GiB", "--weights", "float", "--prefill-chunk", "300"))
    assert fixed.prefill_chunk == 300
