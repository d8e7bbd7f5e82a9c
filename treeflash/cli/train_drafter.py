"""treeflash train-drafter: train a DFlash drafter for a target, on the target's own answers.

DIR gets the drafter in z-lab's format (config.json + model.safetensors: `--draft dflash
--draft-model DIR` loads it) and DIR/train/ the work: data.safetensors (the generated sequences),
run.json, checkpoint/, log.jsonl, summary.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from treeflash.errors import InvalidRequestError

EXAMPLES = """examples:
  treeflash train-drafter --out ./smollm2-dflash                 # the embedded SmolLM2-135M, builtin prompts
  treeflash train-drafter --target ./Qwen3-8B --out ./q3-dflash --layers 5 --tokens 5000000 --steps 20000
  treeflash train-drafter --out ./smollm2-dflash --resume        # continue from the last checkpoint
  treeflash train-drafter --out ./smollm2-dflash-v2 --init ./smollm2-dflash --seed 1   # more training, new data, from a drafter
  treeflash train-drafter --out ./big --tokens 20000000 --generate-only --seed 3       # data first (one job) ...
  treeflash train-drafter --out ./big --init ./smollm2-dflash --resume --steps 20000  # ... then train on it from a drafter
  treeflash train-drafter --out ./smollm2-dflash --extra-passes 2 --tokens 3000000   # greedy answers, then 2 sampled rounds
  treeflash train-drafter --out ./smollm2-dflash --self-prompts 6000   # + 6000 questions the target writes itself
  treeflash train-drafter --out ./smollm2-dflash --gen-engine hf   # answers from transformers' generate, not treeflash's batched CUDA graphs
  treeflash generate --draft dflash --draft-model ./smollm2-dflash --chat "Write quicksort in Python"
"""


def add_parser(sub) -> None:
    p = sub.add_parser("train-drafter", help="train a DFlash drafter on the target's own outputs", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="the target: Hugging Face directory or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, help="output directory (the drafter; work files under DIR/train)")
    p.add_argument("--layers", type=int, default=3, help="draft layers = target layers read (default 3)")
    p.add_argument("--block-size", type=int, default=16, help="block size B: drafts B-1 tokens per pass (default 16)")
    d = p.add_argument_group("data")
    d.add_argument("--prompts", default="builtin", help="'builtin', or a .txt (one prompt per line) / .jsonl ({prompt} or {messages}) file the target answers")
    d.add_argument("--data", default=None, help="ready sequences instead (.jsonl {prompt, completion} / {messages} / {text}, or .txt)")
    d.add_argument("--tokens", type=int, default=1_000_000, help="response tokens to generate (default 1M)")
    d.add_argument("--max-new-tokens", type=int, default=512, help="longest answer per prompt (default 512)")
    d.add_argument("--max-len", type=int, default=1024, help="longest sequence, prompt + answer (default 1024)")
    d.add_argument("--gen-batch-size", type=int, default=256, help="prompts per generate call (default 256)")
    d.add_argument("--temperature", type=float, default=0.0, help="answer sampling temperature (default 0: greedy)")
    d.add_argument("--extra-passes", type=int, default=0,
                   help="after the first answers, answer the prompts again this many times, sampled (more distinct data)")
    d.add_argument("--extra-temperature", type=float, default=0.8, help="sampling temperature of the extra passes (default 0.8)")
    d.add_argument("--self-prompts", type=int, default=0,
                   help="also let the target write this many user prompts itself (sampled, started with short openers), "
                        "answered like the others: more distinct prompts than the builtin list (default 0)")
    d.add_argument("--self-prompt-temperature", type=float, default=1.0, help="sampling temperature of the self-written prompts (default 1.0)")
    d.add_argument("--gen-time-limit", type=float, default=None, help="stop generating after this many seconds")
    d.add_argument("--gen-engine", choices=("auto", "treeflash", "hf"), default="auto",
                   help="who answers the prompts: treeflash's batched generator (static KV cache, the decode step as "
                        "one CUDA graph; dense llama/qwen2/qwen3 targets) or transformers' generate; auto (default): "
                        "treeflash for a dense target on CUDA, else transformers")
    d.add_argument("--gen-static", action="store_true",
                   help="with transformers' generate: pad every call to one shape (--gen-batch-size prompts, the longest "
                        "prompt --max-len allows) on a static KV cache, which transformers compiles on CUDA; falls back "
                        "to the dynamic cache with a warning if that fails (default: off)")
    d.add_argument("--generate-only", action="store_true",
                   help="stop once the data is saved (DIR/train/data.safetensors); train later with --resume")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=2000, help="optimizer steps (default 2000)")
    t.add_argument("--batch-size", type=int, default=16, help="sequences per step (default 16)")
    t.add_argument("--blocks-per-seq", type=int, default=32, help="anchors per sequence (default 32)")
    t.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (default 6e-4)")
    t.add_argument("--gamma", type=float, default=7.0, help="loss weight decay over depth, exp(-(k-1)/gamma); 0 = uniform (default 7)")
    t.add_argument("--checkpoint-every", type=int, default=500)
    t.add_argument("--eval-every", type=int, default=100, help="held-out acceptance estimate every N steps")
    t.add_argument("--time-limit", type=float, default=None, help="fit the training into this many seconds (fewer steps)")
    t.add_argument("--resume", action="store_true", help="continue from DIR/train (data, weights, optimizer, step)")
    t.add_argument("--init", default=None, metavar="DRAFTER",
                   help="start from this exported drafter's weights (a DFlash directory trained for this target; its "
                        "layers, block size and mask token replace --layers/--block-size) with a fresh optimizer and "
                        "schedule: more training on new data (another --seed) without redoing the first run. With "
                        "--resume before any checkpoint exists: train on the data DIR already holds (--generate-only)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--cache-features", default="auto", choices=["auto", "on", "off"],
                   help="capture the target's features for all the data once, before training, instead of every "
                        "step (auto: when they take at most half the free memory)")
    o = p.add_argument_group("runtime and export")
    o.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    o.add_argument("--export-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    o.add_argument("--max-shard-mb", type=float, default=None, help="split the exported weights into shards of at most this size")
    o.add_argument("--export-last", action="store_true",
                   help="export the latest weights (default: those of the evaluation with the best held-out tau_est)")
    o.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from treeflash.models.loader import load_model
    from treeflash.spec.dflash_model import DFlashModel
    from treeflash.train.features import TargetTwin
    from treeflash.train.recipe import drafter_config, pick_mask_token
    from treeflash.train.trainer import Trainer, TrainConfig, init_weights

    _check(args)
    out = Path(args.out).expanduser()
    work = out / "train"
    if (work / "checkpoint").exists() and not args.resume:
        raise InvalidRequestError(f"{out} already holds a training run: pass --resume to continue it, or another --out", "out")
    if args.init and args.resume and (work / "checkpoint" / "state.json").is_file():
        raise InvalidRequestError(f"{out} holds a checkpoint: --resume continues it and --init would start over from "
                                  f"{args.init}; pass one of them (--init with --resume trains on DIR's saved data only "
                                  "before any checkpoint exists)", "init")
    progress = not args.quiet
    loaded = load_model(args.target, device=args.device, progress=progress)
    target = loaded.model
    tok = loaded.tokenizer
    run_file = work / "run.json"
    init = _init_drafter(args, target) if args.init else None
    if init is not None:
        c = init.config
        layers, block_size, mask_id = c.num_layers, c.block_size, c.mask_token_id
        saved = json.loads(run_file.read_text()) if args.resume and run_file.is_file() else None
        if saved is not None and (saved["layers"], saved["block_size"], saved["mask_token_id"]) != (layers, block_size, mask_id):
            raise InvalidRequestError(f"--init {args.init}: {layers} layers, block {block_size}, mask {mask_id}; the saved run "
                                      f"in {work} has {saved['layers']}, {saved['block_size']}, {saved['mask_token_id']}", "init")
    elif args.resume and run_file.is_file():
        saved = json.loads(run_file.read_text())
        layers, block_size, mask_id = saved["layers"], saved["block_size"], saved["mask_token_id"]
    else:
        layers, block_size = args.layers, args.block_size
        mask_id = pick_mask_token(tok, target.config.vocab_size)
    dcfg = drafter_config(target.config, layers, block_size, mask_id)
    eos = set(loaded.config.eos_token_ids) | ({tok.eos_token_id} if tok.eos_token_id is not None else set())
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos or {0})
    static = None
    if getattr(args, "gen_static", False):
        from treeflash.train.data import max_prompt_len

        static = (args.gen_batch_size, max_prompt_len(args.max_len, args.max_new_tokens))
    twin = TargetTwin(target, dcfg.target_layer_ids, tuple(sorted(eos)), pad, static_shape=static,
                      engine=getattr(args, "gen_engine", "auto"))
    work.mkdir(parents=True, exist_ok=True)
    if init is not None and tuple(init.config.target_layer_ids) != tuple(dcfg.target_layer_ids):
        raise InvalidRequestError(f"--init {args.init}: the drafter reads target layers {list(init.config.target_layer_ids)}, "
                                  f"train-drafter would read {list(dcfg.target_layer_ids)} for {layers} layers", "init")
    run_file.write_text(json.dumps({"target": loaded.source, "layers": layers, "block_size": block_size, "mask_token_id": mask_id,
                                    "target_layer_ids": list(dcfg.target_layer_ids), "init": args.init,
                                    "argv": sys.argv[1:]}, indent=2))

    data = _dataset(args, loaded, twin, work, progress)
    if args.generate_only:
        print(f"[train-drafter] data saved: {len(data)} sequences, {data.response_tokens} response tokens in "
              f"{work / 'data.safetensors'}; train with the same --out and --resume", file=sys.stderr)
        return 0
    train, heldout = _split(data)
    print(f"[train-drafter] data: {len(train)} training + {len(heldout)} held-out sequences, "
          f"{train.response_tokens} + {heldout.response_tokens} response tokens; {json.dumps(data.meta)}", file=sys.stderr)

    model = DFlashModel(dcfg)
    init_weights(model, args.seed)
    if init is not None:
        try:
            model.load_state_dict({k: v.float() for k, v in init.state_dict().items()}, strict=True)
        except RuntimeError as e:
            raise InvalidRequestError(f"--init {args.init}: its weights do not fit a drafter for this target: {e}", "init") from None
    config = TrainConfig(
        steps=args.steps, batch_size=args.batch_size, blocks_per_seq=args.blocks_per_seq, lr=args.lr,
        gamma=args.gamma or None, checkpoint_every=args.checkpoint_every, eval_every=args.eval_every, seed=args.seed,
        time_limit_s=args.time_limit, export_dtype=args.export_dtype, export_best=not args.export_last,
        max_shard_bytes=int(args.max_shard_mb * 2**20) if args.max_shard_mb else None,
    )
    provenance = {"target": loaded.source, "init": args.init, "data": data.meta, "train_sequences": len(train), "train_tokens": train.response_tokens}
    stores = _feature_stores(args, twin, train, heldout, progress)
    trainer = Trainer(target, twin, model, train, heldout, config, out, provenance, stores)
    if args.resume and (work / "checkpoint" / "state.json").is_file():
        trainer.load()
        print(f"[train-drafter] resumed at step {trainer.step} of {trainer.total_steps}", file=sys.stderr)
    if torch.cuda.is_available() and target.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    summary = trainer.run(progress=progress)
    exported = trainer.exported_row()
    summary.update(drafter=str(out), layers=layers, block_size=block_size, target_layer_ids=list(dcfg.target_layer_ids),
                   mask_token_id=mask_id, data=data.meta, exported=exported)
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    tau = (summary.get("heldout") or {}).get("tau_est")
    chosen = ""
    if exported is not None and exported.get("step") != summary["step"]:
        chosen = f" (exported: step {exported['step']}, tau estimate {exported['tau_est']:.3f}, the best)"
    print(f"[train-drafter] {summary['step']} steps in {summary['seconds']} s; held-out tau estimate "
          f"{tau if tau is None else round(tau, 3)}{chosen}; drafter in {out}\n"
          f"  use it: treeflash generate --draft dflash --draft-model {out}"
          + (f" --model {args.target}" if args.target else ""), file=sys.stderr)
    return 0


def _init_drafter(args: argparse.Namespace, target):
    """--init: the exported drafter to start from, checked against the target (fp32, on the CPU)."""
    from treeflash.errors import ModelLoadError
    from treeflash.spec.dflash import _check_pair
    from treeflash.spec.dflash_model import load_dflash

    try:
        init = load_dflash(args.init)
        _check_pair(target, init)
    except ModelLoadError as e:
        raise InvalidRequestError(f"--init {args.init}: {e}", "init") from None
    return init


def _check(args: argparse.Namespace) -> None:
    for name in ("layers", "tokens", "steps", "batch_size", "blocks_per_seq", "max_new_tokens", "gen_batch_size", "checkpoint_every", "eval_every"):
        if getattr(args, name) < 1:
            raise InvalidRequestError(f"--{name.replace('_', '-')} must be >= 1", name)
    if args.block_size < 2:
        raise InvalidRequestError("--block-size must be >= 2", "block_size")
    if args.max_len < 16:
        raise InvalidRequestError("--max-len must be >= 16", "max_len")
    if args.lr <= 0 or args.temperature < 0 or args.gamma < 0:
        raise InvalidRequestError("--lr must be > 0, --temperature and --gamma >= 0", "lr")
    if args.extra_passes < 0 or args.extra_temperature <= 0:
        raise InvalidRequestError("--extra-passes must be >= 0 and --extra-temperature > 0", "extra_passes")
    if args.self_prompts < 0 or args.self_prompt_temperature <= 0:
        raise InvalidRequestError("--self-prompts must be >= 0 and --self-prompt-temperature > 0", "self_prompts")


def _dataset(args, loaded, twin, work: Path, progress: bool):
    from treeflash.train.data import Dataset, generate_dataset, read_data
    from treeflash.train.prompts import load_prompts

    path = work / "data.safetensors"
    if args.resume and path.is_file():
        return Dataset.load(path)
    if args.data:
        data = read_data(args.data, loaded, args.max_len)
    else:
        prompts = load_prompts(args.prompts, args.seed)
        time_limit, own_meta = args.gen_time_limit, None
        if args.self_prompts:  # a quarter of the generation time at most goes to writing them
            import random
            import time

            from treeflash.train.self_prompts import self_prompts

            t0 = time.perf_counter()
            own, own_meta = self_prompts(twin, loaded, args.self_prompts, args.seed, args.self_prompt_temperature,
                                         batch_size=args.gen_batch_size,
                                         time_limit_s=None if time_limit is None else 0.25 * time_limit, progress=progress)
            if time_limit is not None:
                time_limit = max(1.0, time_limit - (time.perf_counter() - t0))
            prompts = prompts + own
            random.Random(args.seed).shuffle(prompts)  # a token budget samples both kinds
        data = generate_dataset(twin, loaded, prompts, args.tokens, args.max_new_tokens, args.gen_batch_size, args.max_len,
                                args.temperature, time_limit, progress, args.seed,
                                args.extra_passes, args.extra_temperature)
        data.meta["prompts"] = args.prompts
        data.meta["engine"] = twin.engine
        if own_meta is not None:
            data.meta["self_prompts"] = own_meta
    data.save(path)
    return data


def _free_bytes(device) -> int:
    import os

    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def _feature_stores(args, twin, train, heldout, progress: bool):
    """--cache-features: the (train, heldout) FeatureStores, or None to capture every step."""
    from treeflash.train.features import FeatureStore

    need = FeatureStore.nbytes_for(train, twin) + FeatureStore.nbytes_for(heldout, twin)
    free = _free_bytes(twin.device)
    if args.cache_features == "off" or (args.cache_features == "auto" and need > free // 2):
        if args.cache_features == "auto":
            print(f"[train-drafter] features captured every step: caching them would take {need / 2**30:.2f} GiB "
                  f"of {free / 2**30:.1f} GiB free", file=sys.stderr)
        return None
    print(f"[train-drafter] capturing the target's features once: {need / 2**30:.2f} GiB", file=sys.stderr)
    return (FeatureStore.build(twin, train, progress=progress, desc="features (train)"),
            FeatureStore.build(twin, heldout, progress=progress, desc="features (held out)"))


def _split(data):
    """Every k-th prompt is held out (2%, 1 .. 64 of them) with all its answers: never trained on
    (not even another sampled answer to the same prompt), used for tau_est."""
    from treeflash.train.data import prompt_groups

    if len(data) < 2:
        raise InvalidRequestError(f"only {len(data)} training sequence(s): raise --tokens or give more prompts", "tokens")
    groups = prompt_groups(data)
    if len(groups) < 2:
        raise InvalidRequestError("every training sequence has the same prompt: give more prompts", "prompts")
    n = len(groups)
    held = max(1, min(64, n // 50))
    k = n // held
    held_idx = {i for g in range(k - 1, n, k)[:held] for i in groups[g]}
    return data.subset([i for i in range(len(data)) if i not in held_idx]), data.subset(sorted(held_idx))
