"""Trainer: the loop, checkpoints, resume, and the held-out acceptance estimate.

One step: take `batch_size` sequences (an epoch-wise permutation, a pure function of the step),
capture the frozen target's features (or read them from a FeatureStore captured once), draw
`blocks_per_seq` anchors per sequence (a generator seeded by the step), run every block in one
drafter pass, and take an AdamW step on the depth-weighted cross-entropy. Because batches and anchors depend only on (seed, step), a resumed
run continues exactly where the interrupted one stopped.

Checkpoint (out/train/checkpoint/, never pickle): drafter.safetensors (fp32 weights),
optimizer.safetensors (AdamW moments and step per parameter), state.json (step, totals, config,
history). Every checkpoint also exports the drafter in z-lab's format to out/ itself.

Held-out acceptance estimate: on sequences never trained on, at fixed anchors, the length of
the run of top-1 hits from depth 1 (what greedy chain verification would accept from that
block); `tau_est` = 1 + its mean (the bonus token).
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from treeflash.models.transformer import CausalLM
from treeflash.spec.dflash_model import DFlashModel
from treeflash.train.data import Dataset, pad_right
from treeflash.train.export import export_drafter
from treeflash.train.features import FeatureStore
from treeflash.train.recipe import accepted_lengths, block_loss, draft_hidden, lr_at, sample_blocks


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000  # total optimizer steps (the LR schedule spans them)
    batch_size: int = 16  # sequences per step
    blocks_per_seq: int = 32  # anchors drawn per sequence
    lr: float = 6e-4
    warmup: float = 0.04  # fraction of steps
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    gamma: float | None = 7.0  # depth-weight decay exp(-(k-1)/gamma); None = uniform
    checkpoint_every: int = 500
    eval_every: int = 100
    seed: int = 0
    time_limit_s: float | None = None  # fit `steps` into this many seconds (measured after a few steps)
    export_dtype: str = "bfloat16"
    max_shard_bytes: int | None = None
    # export the weights of the evaluation with the highest held-out tau_est so far, not the latest:
    # a drafter short of data peaks and then overfits (the shipped v2: 2.16 at step 2,500, 2.13 at 3,000)
    export_best: bool = True

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.blocks_per_seq < 1:
            raise ValueError("steps, batch_size and blocks_per_seq must be >= 1")


class Trainer:
    def __init__(self, target: CausalLM, twin, model: DFlashModel, train: Dataset, heldout: Dataset,
                 config: TrainConfig, out_dir: str | Path, provenance: dict | None = None,
                 features: tuple[FeatureStore, FeatureStore] | None = None):
        self.target, self.twin, self.model = target, twin, model
        self.train_data, self.heldout = train, heldout
        # features captured once (train, heldout); None: every batch captures its own
        self.train_features, self.heldout_features = features if features is not None else (None, None)
        self.config = config
        self.out = Path(out_dir)
        self.work = self.out / "train"
        self.work.mkdir(parents=True, exist_ok=True)
        self.provenance = provenance or {}
        self.device = target.device
        self.cuda = self.device.type == "cuda"
        self.model.to(self.device).train()
        self.params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        groups = [{"params": [p for _, p in self.params if p.dim() > 1], "weight_decay": config.weight_decay},
                  {"params": [p for _, p in self.params if p.dim() <= 1], "weight_decay": 0.0}]  # norms: no decay
        self.opt = torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))
        self.step = 0
        self.total_steps = config.steps
        self.history: list[dict] = []
        self._perms: dict[int, torch.Tensor] = {}
        self.best: dict | None = None  # {"row": the history row, "state": weights on the CPU} of the best evaluation

    # -- data --

    def batch_indices(self, step: int) -> list[int]:
        n, bs = len(self.train_data), self.config.batch_size
        out = []
        for pos in range(step * bs, step * bs + bs):
            epoch = pos // n
            if epoch not in self._perms:
                self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
                self._perms[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(self.config.seed * 7919 + epoch))
            out.append(int(self._perms[epoch][pos % n]))
        return out

    def _collate(self, data: Dataset, indices: list[int]):
        seqs = [data.sequence(i) for i in indices]
        ids, mask = pad_right(seqs)
        return ids, mask, torch.tensor([len(s) for s in seqs]), data.response_start[indices]

    def _forward(self, data: Dataset, indices: list[int], generator: torch.Generator, store: FeatureStore | None):
        c = self.model.config
        ids, mask, lengths, starts = self._collate(data, indices)
        blocks = sample_blocks(ids, lengths, starts, self.config.blocks_per_seq, c.block_size, c.mask_token_id, generator)
        dev = self.device
        features = store.batch(indices, ids.shape[1]) if store is not None else self.twin.capture(ids.to(dev), mask.to(dev))
        with self._autocast():
            embeds = self.target.embed(blocks.input_ids.to(dev)).float()  # an fp32 residual stream; matmuls autocast
            if c.input_embedding_scale != 1.0:
                embeds = embeds * c.input_embedding_scale
            hidden = draft_hidden(self.model, features, embeds, blocks.positions.to(dev), blocks.anchors.to(dev))
            result = block_loss(lambda h: self.model.logits(h, self.target.head), hidden, blocks.labels.to(dev), self.config.gamma)
        return result, blocks

    def _autocast(self):
        if self.cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- the loop --

    def train_step(self) -> dict:
        cfg = self.config
        lr = lr_at(self.step, self.total_steps, cfg.lr, cfg.warmup)
        for g in self.opt.param_groups:
            g["lr"] = lr
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.step)
        result, blocks = self._forward(self.train_data, self.batch_indices(self.step), gen, self.train_features)
        result.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_([p for _, p in self.params], cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        accept = accepted_lengths(result.correct, blocks.valid.to(result.correct.device))
        return {"step": self.step, "loss": result.loss.detach().item(), "lr": lr, "grad_norm": float(grad_norm),
                "accept_len": float(accept.mean()) if accept.numel() else 0.0}

    @torch.no_grad()
    def evaluate(self, max_sequences: int = 64) -> dict:
        """Held-out loss, top-1 accuracy per depth and the greedy chain acceptance estimate."""
        self.model.eval()
        n = min(len(self.heldout), max_sequences)
        gen = torch.Generator().manual_seed(12345)
        losses, accepts, correct, labelled = [], [], None, None
        bs = self.config.batch_size
        for s in range(0, n, bs):
            result, blocks = self._forward(self.heldout, list(range(s, min(n, s + bs))), gen, self.heldout_features)
            losses.append(float(result.loss))
            accepts.append(accepted_lengths(result.correct, blocks.valid.to(result.correct.device)).cpu())
            c, l = result.correct.sum((0, 1)).cpu(), result.labelled.sum((0, 1)).cpu()
            correct, labelled = (c, l) if correct is None else (correct + c, labelled + l)
        self.model.train()
        accept = torch.cat(accepts) if accepts else torch.zeros(0)
        mean_accept = float(accept.mean()) if accept.numel() else 0.0
        return {
            "step": self.step,
            "heldout_loss": sum(losses) / max(len(losses), 1),
            "accept_len": mean_accept,
            "tau_est": 1.0 + mean_accept,
            "acc_per_depth": [round(float(a), 4) for a in (correct / labelled.clamp(min=1))] if correct is not None else [],
            "blocks": int(accept.numel()),
        }

    def run(self, until: int | None = None, progress: bool = True) -> dict:
        """Train to `total_steps` (or stop at `until`); checkpoints on the way and at the end."""
        from tqdm.auto import tqdm

        cfg = self.config
        stop = min(self.total_steps, until) if until is not None else self.total_steps
        t0, first = time.perf_counter(), self.step
        # With a time limit, the schedule is fitted to the measured step time after 13 steps, then
        # refitted on later windows: on a GPU the first hundred steps can run 5x slower than the rest
        # (new batch shapes select kernels, the allocator grows), so one early measurement undershoots.
        refit_at = [13, 63, 263, 1263] if cfg.time_limit_s is not None else []
        requested = self.total_steps
        mark_t, mark_step = t0, first
        bar = tqdm(total=self.total_steps, initial=self.step, desc="training", unit="step", disable=not progress)
        ema, last_eval, m = None, None, None
        try:
            while self.step < stop:
                m = self.train_step()
                ema = m["loss"] if ema is None else 0.95 * ema + 0.05 * m["loss"]
                bar.update(1)
                if self.step - first == 3:
                    mark_t, mark_step = time.perf_counter(), self.step  # the first steps pay for kernel selection and allocation
                if refit_at and self.step - first >= refit_at[0]:
                    refit_at.pop(0)
                    now = time.perf_counter()
                    per_step = (now - mark_t) / max(1, self.step - mark_step)  # the latest window only
                    mark_t, mark_step = now, self.step
                    left = cfg.time_limit_s - (now - t0)
                    fits = min(requested, self.step + max(1, int(left * 0.9 / per_step)))
                    if fits != self.total_steps:
                        self.total_steps = fits
                        stop = min(until, fits) if until is not None else fits
                        bar.total = self.total_steps
                        bar.write(f"time limit: training {self.total_steps} steps ({per_step * 1000:.0f} ms/step)")
                if cfg.time_limit_s is not None and time.perf_counter() - t0 > 1.05 * cfg.time_limit_s:
                    bar.write(f"time limit: stopping at step {self.step}")  # steps got slower than measured
                    stop = self.total_steps = self.step
                if self.step % cfg.eval_every == 0 or self.step == stop:
                    last_eval = self._record(m, ema)
                post = {"loss": f"{ema:.3f}", "lr": f"{m['lr']:.1e}"}
                if last_eval:
                    post["tau_est"] = f"{last_eval['tau_est']:.2f}"
                bar.set_postfix(post, refresh=False)
                if self.step % cfg.checkpoint_every == 0 and self.step < stop:
                    self.save()
        except KeyboardInterrupt:
            bar.write(f"interrupted at step {self.step}: saving a checkpoint")
            self.save()
            raise
        finally:
            bar.close()
        if m is not None and (last_eval is None or last_eval["step"] != self.step):
            last_eval = self._record(m, ema)
        self.save()
        return {"step": self.step, "total_steps": self.total_steps, "seconds": round(time.perf_counter() - t0, 1),
                "loss_ema": ema, "heldout": last_eval}

    def _record(self, m: dict, ema: float) -> dict:
        """Held-out evaluation, appended to the history and to log.jsonl."""
        result = self.evaluate()
        self.history.append({**m, "loss_ema": ema, **{k: v for k, v in result.items() if k != "step"}})
        self._log(self.history[-1])
        if self.best is None or result["tau_est"] > self.best["row"]["tau_est"]:
            self.best = {"row": self.history[-1], "state": {n: t.detach().cpu().clone() for n, t in self.model.state_dict().items()}}
        return result

    def _log(self, row: dict) -> None:
        with open(self.work / "log.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    # -- checkpoints --

    @property
    def checkpoint_dir(self) -> Path:
        return self.work / "checkpoint"

    def save(self) -> None:
        """Checkpoint (atomically: written aside, then renamed) and export the drafter."""
        from safetensors.torch import save_file

        ck = self.checkpoint_dir
        tmp = ck.with_name("checkpoint.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({n: p.detach().cpu().contiguous() for n, p in self.model.state_dict().items()}, str(tmp / "drafter.safetensors"))
        moments = {}
        for i, (name, p) in enumerate(self.params):
            for key, value in self.opt.state.get(p, {}).items():
                moments[f"{name}/{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
        save_file(moments, str(tmp / "optimizer.safetensors"))
        if self.best is not None:
            save_file(self.best["state"], str(tmp / "best.safetensors"))
        state = {"step": self.step, "total_steps": self.total_steps, "config": asdict(self.config),
                 "history": self.history, "provenance": self.provenance,
                 "best": self.best["row"] if self.best is not None else None}
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        old = ck.with_name("checkpoint.old")
        shutil.rmtree(old, ignore_errors=True)
        if ck.exists():
            ck.rename(old)
        tmp.rename(ck)
        shutil.rmtree(old, ignore_errors=True)
        self.export()

    def _exports_best(self) -> bool:
        # best is set by an evaluation, which also appends to history: history is never empty here
        return self.config.export_best and self.best is not None and self.best["row"]["tau_est"] > self.history[-1]["tau_est"]

    def exported_row(self) -> dict | None:
        """The history row of the weights export() writes (None before any evaluation)."""
        if self._exports_best():
            return self.best["row"]
        return self.history[-1] if self.history else None

    def export(self) -> list[str]:
        """The drafter into out/: the best evaluation's weights (TrainConfig.export_best), else the latest."""
        model, row = self.model, self.history[-1] if self.history else None
        extra = {**self.provenance, "step": self.step, "heldout": row}
        if self._exports_best():
            best = self.best
            model = copy.deepcopy(self.model)
            model.load_state_dict(best["state"])
            extra = {**self.provenance, "step": best["row"]["step"], "heldout": best["row"],
                     "chosen": f"the best held-out tau_est of {len(self.history)} evaluations (the last: step {self.step}, "
                               f"tau_est {row['tau_est']:.3f})"}
        return export_drafter(model, self.out, self.target.config.num_layers, self.target.config.vocab_size,
                              getattr(torch, self.config.export_dtype), self.config.max_shard_bytes, extra)

    def load(self) -> None:
        """Resume: weights, AdamW state, step and history from the last checkpoint."""
        from safetensors.torch import load_file

        ck = self.checkpoint_dir
        if not (ck / "state.json").is_file():
            raise FileNotFoundError(f"{ck}: no checkpoint to resume from")
        state = json.loads((ck / "state.json").read_text())
        weights = load_file(str(ck / "drafter.safetensors"), device=str(self.device))
        self.model.load_state_dict(weights, strict=True)
        moments = load_file(str(ck / "optimizer.safetensors"))
        for name, p in self.params:
            entry = {k.split("/", 1)[1]: v for k, v in moments.items() if k.split("/", 1)[0] == name}
            if entry:
                self.opt.state[p] = {k: (v if k == "step" else v.to(self.device)) for k, v in entry.items()}
        self.step = int(state["step"])
        # the schedule of the interrupted run (maybe fitted to a time limit), unless --steps changed
        same = self.config.steps == state["config"]["steps"]
        self.total_steps = int(state["total_steps"]) if same else self.config.steps
        self.history = state.get("history", [])
        if state.get("best") is not None and (ck / "best.safetensors").is_file():
            self.best = {"row": state["best"], "state": load_file(str(ck / "best.safetensors"))}


def init_weights(model: DFlashModel, seed: int = 0, std: float = 0.02) -> None:
    """Linear weights ~ N(0, std), biases 0, norm weights 1 (transformers' Qwen3 init)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * std)
                if m.bias is not None:
                    m.bias.zero_()
