"""train-drafter end to end on a tiny random target: the data is the target's own greedy output,
the exported drafter loads with `--draft dflash` and decodes losslessly, and resume continues
exactly where an interrupted run stopped."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.spec.test_lossless_greedy import run as decode
from tests.train.tiny_target import save_tiny_target
from treeflash.cli.main import main
from treeflash.models.loader import load_model
from treeflash.spec.drafter import DraftOptions, build_drafter
from treeflash.spec.dflash_model import load_dflash
from treeflash.train.data import Dataset

TRAIN = ["--layers", "2", "--block-size", "6", "--tokens", "1200", "--max-new-tokens", "40", "--gen-batch-size", "16",
         "--batch-size", "6", "--blocks-per-seq", "8", "--eval-every", "5", "--checkpoint-every", "10", "--lr", "2e-3",
         "--device", "cpu", "--quiet", "--max-shard-mb", "0.04"]




@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target = save_tiny_target(root / "target")
    out = root / "drafter"
    assert main(["train-drafter", "--target", str(target), "--out", str(out), "--steps", "20", *TRAIN]) == 0
    return target, out, load_model(str(target), device="cpu", progress=False)


def test_data_is_the_targets_own_greedy_output(trained):
    _, out, loaded = trained
    data = Dataset.load(out / "train" / "data.safetensors")
    assert data.response_tokens >= 1200 and data.meta["kind"] == "generated"
    for i in (0, len(data) - 1):
        seq, start = data.sequence(i).tolist(), int(data.response_start[i])
        ref, _ = decode(loaded.model, seq[:start], len(seq) - start)
        assert seq[start:] == ref


def test_export_format_and_shards(trained):
    _, out, loaded = trained
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dflash_config"] == {"target_layer_ids": [1, 3], "mask_token_id": 259, "block_size": 6}
    assert cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == 64 and cfg["num_target_layers"] == 6
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1 and all(f.stat().st_size < 0.04 * 2**20 + 4096 for f in shards)
    assert (out / "model.safetensors.index.json").is_file() and not (out / "model.safetensors").exists()
    model = load_dflash(out)
    assert model.config.block_size == 6 and model.config.target_layer_ids == (1, 3)


def test_training_learns_and_reports_acceptance(trained):
    _, out, _ = trained
    log = [json.loads(line) for line in (out / "train" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [5, 10, 15, 20]
    assert log[-1]["heldout_loss"] < 0.8 * math.log(260)  # from ~ln(vocab) at random init
    assert log[-1]["tau_est"] == 1 + log[-1]["accept_len"] and len(log[-1]["acc_per_depth"]) == 5
    summary = json.loads((out / "train" / "summary.json").read_text())
    assert summary["step"] == 20 and summary["heldout"]["tau_est"] >= 1.0


@pytest.mark.parametrize("budget", ["chain", 8])
def test_drafter_loads_with_dflash_and_is_lossless(trained, budget):
    _, out, loaded = trained
    options = DraftOptions(draft_model=str(out), budget=5 if budget == "chain" else budget, tree=budget != "chain")
    drafter = build_drafter("dflash", loaded, options)
    prompt = loaded.tokenizer("<|im_start|>user\nWrite a haiku about rivers.<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    ref, _ = decode(loaded.model, prompt, 60)
    out_ids, stats = decode(loaded.model, prompt, 60, drafter)
    assert out_ids == ref
    assert stats.passes < 60  # drafts were accepted


def test_resume_continues_the_step_counter_and_the_loss(trained, tmp_path):
    target, out, _ = trained
    # a second run of the same data: 10 steps, then resumed to 20; its weights equal the straight run's
    import shutil

    part = tmp_path / "part"
    (part / "train").mkdir(parents=True)
    shutil.copy(out / "train" / "data.safetensors", part / "train" / "data.safetensors")
    args = ["train-drafter", "--target", str(target), "--out", str(part), *TRAIN]
    assert main([*args, "--steps", "20", "--resume"]) == 0  # data but no checkpoint yet: starts at step 0
    state = json.loads((part / "train" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 20
    assert main([*args, "--steps", "24", "--resume"]) == 0  # continue: steps 20 .. 24 of a longer schedule
    state = json.loads((part / "train" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 24 and [r["step"] for r in state["history"]][-2:] == [20, 24]
    assert state["history"][-1]["heldout_loss"] < 0.8 * math.log(260)


def test_interrupted_and_resumed_equals_uninterrupted(trained, tmp_path):
    """Trainer level: 6 steps straight == 3 steps, a checkpoint, a fresh trainer loading it, 3 more."""
    from treeflash.spec.dflash_model import DFlashModel
    from treeflash.train.features import TargetTwin
    from treeflash.train.recipe import drafter_config
    from treeflash.train.trainer import Trainer, TrainConfig, init_weights

    _, out, loaded = trained
    data = Dataset.load(out / "train" / "data.safetensors")
    train, held = data.subset(list(range(len(data) - 1))), data.subset([len(data) - 1])
    dcfg = drafter_config(loaded.config, 2, 6, 259)
    twin = TargetTwin(loaded.model, dcfg.target_layer_ids, (2,), 0)
    config = TrainConfig(steps=6, batch_size=4, blocks_per_seq=4, eval_every=100, checkpoint_every=100, lr=2e-3)

    def fresh(where):
        model = DFlashModel(dcfg)
        init_weights(model, seed=0)
        return Trainer(loaded.model, twin, model, train, held, config, where)

    straight = fresh(tmp_path / "a")
    straight.run(progress=False)
    first = fresh(tmp_path / "b")
    first.run(until=3, progress=False)
    assert first.step == 3
    second = fresh(tmp_path / "b")
    second.load()
    assert second.step == 3 and second.opt.state  # AdamW moments restored
    second.run(progress=False)
    assert second.step == 6
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), second.model.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_teacher_forced_acceptance_equals_decoding_acceptance(trained):
    """What training measures is what decoding gets: at every root the chain decoder visits, the
    accepted length equals the teacher-forced one of a block anchored there (same features, same
    positions, same context cut), so tau_est is the real chain tau on the target's own text."""
    from treeflash.spec.decoder import Decoder
    from treeflash.spec.dflash import DFlashDrafter
    from treeflash.spec.sampling import SamplingParams
    from treeflash.train.features import TargetTwin
    from treeflash.train.recipe import accepted_lengths, block_loss, draft_hidden, make_blocks

    _, out, loaded = trained
    target = loaded.model
    draft = load_dflash(out)
    b = draft.config.block_size
    data = Dataset.load(out / "train" / "data.safetensors")
    seq, start = data.sequence(0), int(data.response_start[0])
    drafter = DFlashDrafter(target, draft, budget=b - 1, tree=False)
    dec = Decoder(target, target.new_cache(len(seq) + 2 * b), SamplingParams(), drafter)
    dec.prefill(seq[:start].tolist())
    roots, decoded = [], []
    while len(dec.tokens) + b <= len(seq):
        roots.append(len(dec.tokens))  # the root sits at this position
        decoded.append(len(dec.step()) - 1)
    assert dec.tokens == seq[: len(dec.tokens)].tolist()  # greedy: the target's own text again
    twin = TargetTwin(target, draft.config.target_layer_ids, (2,), 0)
    with torch.no_grad():
        features = twin.capture(seq[None], torch.ones(1, len(seq), dtype=torch.long))
        blocks = make_blocks(seq[None], torch.tensor([len(seq)]), torch.tensor([roots]), torch.ones(1, len(roots), dtype=torch.bool),
                             b, draft.config.mask_token_id)
        hidden = draft_hidden(draft, features, target.embed(blocks.input_ids), blocks.positions, blocks.anchors)
        result = block_loss(lambda h: draft.logits(h, target.head), hidden, blocks.labels, None)
    assert accepted_lengths(result.correct, blocks.valid).long().tolist() == decoded
    assert sum(decoded) > 0


def timed_trainer(trained, tmp_path, **config):
    """A one-layer drafter's Trainer over the smoke run's data, with the given TrainConfig fields."""
    from treeflash.spec.dflash_model import DFlashModel
    from treeflash.train.features import TargetTwin
    from treeflash.train.recipe import drafter_config
    from treeflash.train.trainer import Trainer, TrainConfig

    _, out, loaded = trained
    data = Dataset.load(out / "train" / "data.safetensors")
    dcfg = drafter_config(loaded.config, 1, 4, 259)
    twin = TargetTwin(loaded.model, dcfg.target_layer_ids, (2,), 0)
    cfg = TrainConfig(batch_size=2, blocks_per_seq=2, **config)
    return Trainer(loaded.model, twin, DFlashModel(dcfg), data, data.subset([0]), cfg, tmp_path)


def test_time_limit_shrinks_the_schedule(trained, tmp_path, monkeypatch):
    """20 ms a step on a fake clock (a real step's time varies with the machine's load: at 9 ms, 20
    steps fit 0.2 s): the schedule shrinks to what fits."""
    import treeflash.train.trainer as trainer_mod

    trainer = timed_trainer(trained, tmp_path, steps=10_000, eval_every=1000, checkpoint_every=1000, time_limit_s=0.2)
    clock = [0.0]
    monkeypatch.setattr(trainer_mod.time, "perf_counter", lambda: clock[0])
    real_step = trainer.train_step

    def timed_step():
        clock[0] += 0.02
        return real_step()

    monkeypatch.setattr(trainer, "train_step", timed_step)
    summary = trainer.run(progress=False)
    assert summary["step"] == summary["total_steps"] < 20  # out of time: the schedule ends where the run does
    assert summary["heldout"]["step"] == summary["step"]


def test_time_limit_refits_after_slow_first_steps(trained, tmp_path, monkeypatch):
    """GPU-like: 13 slow steps, then fast ones. The first fit undershoots; later windows extend it."""
    import treeflash.train.trainer as trainer_mod

    trainer = timed_trainer(trained, tmp_path, steps=1000, eval_every=10_000, checkpoint_every=10_000, time_limit_s=60.0)
    clock = [0.0]
    monkeypatch.setattr(trainer_mod.time, "perf_counter", lambda: clock[0])

    def fake_step():
        trainer.step += 1
        clock[0] += 0.2 if trainer.step <= 13 else 0.01  # seconds per step, on the fake clock
        return {"loss": 1.0, "lr": 1e-3}

    monkeypatch.setattr(trainer, "train_step", fake_step)
    summary = trainer.run(progress=False)
    # 0.2 s/step at step 13 fits ~270 steps; at step 63 the window shows 0.01 s/step: all 1000 fit
    assert summary["step"] == summary["total_steps"] == 1000


def test_decode_evaluation_reports_tau_speedup_and_identity(trained, tmp_path):
    from treeflash.data.prompts import user
    from treeflash.train.evaluate import evaluate

    _, out, loaded = trained
    prompts = [user("a", "Write a haiku about rivers."), user("b", "Explain gravity.")]
    with torch.inference_mode():  # graphs=True on a CPU: the CUDA-graph runner's static path, without graphs
        report = evaluate(loaded, str(out), prompts, tmp_path / "eval.json", max_tokens=20, budgets=(4, "auto"), graphs=True, progress=False)
    assert report["complete"] and json.loads((tmp_path / "eval.json").read_text())["complete"]
    results = report["results"]
    assert list(results) == ["plain", "chain", "ddtree-4", "ddtree-auto"]
    assert results["ddtree-4"]["budget"] == 4 and isinstance(results["ddtree-auto"]["budget"], int)
    assert results["ddtree-auto"]["budget_reason"]
    for name in ("chain", "ddtree-4", "ddtree-auto"):
        assert results[name]["identical_to_plain"] == "2/2" and results[name]["tau"] >= 1.0
        assert results[name]["tokens"] == results["plain"]["tokens"] and results[name]["speedup_vs_plain"] > 0
        # equal lengths (fp32, lossless): the rate ratio is the time ratio
        assert results[name]["tokens_per_s_vs_plain"] == pytest.approx(results[name]["speedup_vs_plain"], rel=2e-3, abs=2e-3)


def test_feature_store_equals_capture_and_trains_the_same(trained, tmp_path):
    """Features captured once (length-sorted batches) equal a capture of each sequence alone, and
    training from the store follows the same trajectory as capturing every step."""
    from treeflash.spec.dflash_model import DFlashModel
    from treeflash.train.features import FeatureStore, TargetTwin
    from treeflash.train.recipe import drafter_config
    from treeflash.train.trainer import Trainer, TrainConfig, init_weights

    _, out, loaded = trained
    data = Dataset.load(out / "train" / "data.safetensors")
    train, held = data.subset(list(range(len(data) - 1))), data.subset([len(data) - 1])
    dcfg = drafter_config(loaded.config, 2, 6, 259)
    twin = TargetTwin(loaded.model, dcfg.target_layer_ids, (2,), 0)
    store = FeatureStore.build(twin, train, batch_tokens=200, progress=False)  # several batches
    assert store.rows.shape == (int(train.offsets[-1]), 2 * loaded.config.hidden_size)
    for i in (0, 3, len(train) - 1):
        seq = train.sequence(i)
        alone = twin.capture(seq[None], torch.ones(1, len(seq), dtype=torch.long))[0]
        torch.testing.assert_close(store.batch([i], len(seq) + 2)[0, : len(seq)], alone, atol=1e-5, rtol=1e-5)
    assert not store.batch([0], train.length(0) + 3)[0, train.length(0):].any()  # padding rows are zeros
    config = TrainConfig(steps=4, batch_size=4, blocks_per_seq=4, eval_every=100, checkpoint_every=100, lr=2e-3)
    trainers = []
    for where, stores in (("live", None), ("stored", (store, FeatureStore.build(twin, held, progress=False)))):
        model = DFlashModel(dcfg)
        init_weights(model, seed=0)
        trainers.append(Trainer(loaded.model, twin, model, train, held, config, tmp_path / where, features=stores))
        trainers[-1].run(progress=False)
    (a, b) = trainers
    assert a.history[-1]["tau_est"] == pytest.approx(b.history[-1]["tau_est"], abs=1e-6)
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4, msg=name)


def test_cache_features_flag(trained, tmp_path, capsys):
    target, out, _ = trained
    import shutil

    part = tmp_path / "cached"
    (part / "train").mkdir(parents=True)
    shutil.copy(out / "train" / "data.safetensors", part / "train" / "data.safetensors")
    args = ["train-drafter", "--target", str(target), "--out", str(part), *TRAIN, "--steps", "5", "--resume"]
    assert main([*args, "--cache-features", "on"]) == 0
    assert "capturing the target's features once" in capsys.readouterr().err
    assert json.loads((part / "train" / "checkpoint" / "state.json").read_text())["step"] == 5


def test_generate_only_saves_the_data_and_trains_nothing(trained, tmp_path):
    target, _, _ = trained
    out = tmp_path / "gen"
    assert main(["train-drafter", "--target", str(target), "--out", str(out), *TRAIN, "--tokens", "100", "--generate-only"]) == 0
    assert Dataset.load(out / "train" / "data.safetensors").response_tokens >= 100
    assert not (out / "train" / "checkpoint").exists() and not (out / "config.json").exists()


def test_gen_static_gives_the_same_data(trained, tmp_path):
    """--gen-static (one padded shape on a static cache; compiled by transformers on CUDA only) gives
    the same greedy data as the dynamic cache through the whole command."""
    target, _, _ = trained
    runs = {}
    for name, extra in (("dynamic", []), ("static", ["--gen-static"])):
        out = tmp_path / name
        assert main(["train-drafter", "--target", str(target), "--out", str(out), *TRAIN, "--tokens", "150",
                     "--generate-only", *extra]) == 0
        data = Dataset.load(out / "train" / "data.safetensors")
        runs[name] = [data.sequence(i).tolist() for i in range(len(data))]
    assert runs["static"] == runs["dynamic"] and runs["static"]


def test_export_keeps_the_best_held_out_estimate(trained, tmp_path, monkeypatch):
    """With tau_est falling after its peak, out/ holds the peak's weights (config.json says which
    step), the checkpoint the latest (for resume), and a resumed trainer still knows the best;
    export_best=False exports the latest."""
    from safetensors.torch import load_file

    from treeflash.spec.dflash_model import DFlashModel
    from treeflash.train.features import TargetTwin
    from treeflash.train.recipe import drafter_config
    from treeflash.train.trainer import Trainer, TrainConfig, init_weights

    _, out, loaded = trained
    data = Dataset.load(out / "train" / "data.safetensors")
    train, held = data.subset(list(range(len(data) - 1))), data.subset([len(data) - 1])
    dcfg = drafter_config(loaded.config, 2, 6, 259)
    twin = TargetTwin(loaded.model, dcfg.target_layer_ids, (2,), 0)
    taus = iter([1.5, 2.0, 1.7, 1.6, 1.9, 1.8])  # evaluations at steps 2, 4, 6 (then a resumed run: 8, 10, 12)

    def fake_eval(self, max_sequences=64):
        return {"step": self.step, "heldout_loss": 1.0, "accept_len": 0.0, "tau_est": next(taus), "acc_per_depth": [], "blocks": 1}

    monkeypatch.setattr(Trainer, "evaluate", fake_eval)

    def trainer(where, steps, best=True):
        model = DFlashModel(dcfg)
        init_weights(model, seed=0)
        config = TrainConfig(steps=steps, batch_size=4, blocks_per_seq=4, eval_every=2, checkpoint_every=100, lr=2e-3,
                             export_dtype="float32", export_best=best)
        return Trainer(loaded.model, twin, model, train, held, config, where)

    t = trainer(tmp_path / "a", 6)
    t.run(progress=False)
    meta = json.loads((tmp_path / "a" / "config.json").read_text())["treeflash"]
    assert meta["step"] == 4 and meta["heldout"]["tau_est"] == 2.0 and "best held-out" in meta["chosen"]
    exported = load_dflash(str(tmp_path / "a"), device="cpu", dtype=torch.float32).state_dict()
    for name, w in t.best["state"].items():
        torch.testing.assert_close(exported[name], w, msg=name)
    latest = load_file(str(tmp_path / "a" / "train" / "checkpoint" / "drafter.safetensors"))
    assert any(not torch.equal(latest[n], w) for n, w in t.best["state"].items())  # the checkpoint holds step 6
    resumed = trainer(tmp_path / "a", 12)
    resumed.load()
    assert resumed.best["row"]["step"] == 4
    resumed.run(progress=False)  # 8: 1.6, 10: 1.9, 12: 1.8 -> step 4's 2.0 stays the best
    assert json.loads((tmp_path / "a" / "config.json").read_text())["treeflash"]["step"] == 4
    taus = iter([1.5, 2.0, 1.7])
    last = trainer(tmp_path / "b", 6, best=False)
    last.run(progress=False)
    assert json.loads((tmp_path / "b" / "config.json").read_text())["treeflash"]["step"] == 6


def test_init_starts_from_an_exported_drafter(trained, tmp_path):
    """--init: a new run (fresh optimizer, new data with another seed) from the exported weights; with a
    vanishing learning rate the export after one step is the drafter it started from."""
    from safetensors.torch import load_file

    target, out, _ = trained
    new = tmp_path / "more"
    args = [a for a in TRAIN if a not in ("--max-shard-mb", "0.04")]
    assert main(["train-drafter", "--target", str(target), "--out", str(new), "--init", str(out), "--seed", "1",
                 "--steps", "1", *args, "--lr", "1e-30", "--export-last"]) == 0
    run = json.loads((new / "train" / "run.json").read_text())
    assert run["init"] == str(out) and run["layers"] == 2 and run["block_size"] == 6
    before = {k: v for f in sorted(out.glob("model-*.safetensors")) for k, v in load_file(f).items()}
    after = load_file(new / "model.safetensors")
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), name
    assert json.loads((new / "config.json").read_text())["treeflash"]["init"] == str(out)


def test_init_errors_name_the_flag(trained, tmp_path, capsys):
    target, out, _ = trained
    assert main(["train-drafter", "--target", str(target), "--out", str(out), *TRAIN, "--init", str(out), "--resume"]) != 0
    assert "holds a checkpoint: --resume continues it and --init would start over" in capsys.readouterr().err
    base = ["train-drafter", "--target", str(target), "--out", str(tmp_path / "x"), *TRAIN]
    assert main([*base, "--init", str(tmp_path / "missing")]) != 0
    err = capsys.readouterr().err
    assert "--init" in err and "missing" in err


def test_init_trains_on_saved_data(trained, tmp_path):
    """--generate-only data, then --init --resume before any checkpoint: the saved sequences, the drafter's weights."""
    import shutil

    target, out, _ = trained
    part = tmp_path / "part"
    (part / "train").mkdir(parents=True)
    shutil.copy(out / "train" / "data.safetensors", part / "train" / "data.safetensors")
    args = [a for a in TRAIN if a not in ("--max-shard-mb", "0.04")]
    assert main(["train-drafter", "--target", str(target), "--out", str(part), "--init", str(out), "--resume",
                 "--steps", "2", *args]) == 0
    summary = json.loads((part / "train" / "summary.json").read_text())
    assert summary["step"] == 2 and summary["data"] == Dataset.load(out / "train" / "data.safetensors").meta
    assert json.loads((part / "train" / "run.json").read_text())["init"] == str(out)
