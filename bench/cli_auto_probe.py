"""Why `treeflash bench --draft dflash` (budget auto) drafted once and then decoded plainly on the H200
(stop 24: bench/results/s24/cli_bench_greedy.json, tau 1.00, chat/0's output unlike plain's), and why
its sampled synchronous run aborted on non-finite probabilities.

Runs `treeflash bench` in this process, its arguments after `--`, with the Decoder instrumented:
every request's prefill (pending drafter rows, draft cache length, device step, skip verdict) and
every step (which path ran: device / sync draft / plain, the guard's state, the tuner's budget, room,
tokens), and every verify's logits checked finite (the first non-finite one is described: nodes,
bucket, rows). Writes the log as JSON.

    python bench/cli_auto_probe.py --out probe.json -- --prompts chat --num-prompts 6 --max-tokens 256 \\
        --temperature 0 --draft dflash --baseline ar
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treeflash.cli.main import main as cli_main  # noqa: E402
from treeflash.spec import decoder as decoder_mod  # noqa: E402
from treeflash.spec.decoder import Decoder  # noqa: E402


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="cli_auto_probe.json")
    p.add_argument("--max-steps-logged", type=int, default=40, help="steps logged per request (the first ones)")
    args = p.parse_args(own)
    requests: list[dict] = []

    prefill = Decoder.prefill

    def logged_prefill(self, prompt_ids, chunk=2048):
        root = prefill(self, prompt_ids, chunk)
        d = self.drafter
        info = {"prompt_tokens": len(prompt_ids), "drafter": d is not None, "steps": [], "sampled": not self.params.greedy}
        if d is not None:
            info.update(pending_rows=sum(r.shape[0] for r in d._pending), draft_len=d.cache.length, observed=d._observed,
                        device_step=self._dev is not None, dev_off=self._dev_off,
                        losses=getattr(self._dev, "losses", None), skipped=getattr(self._dev, "skipped", None),
                        tuner=None if d.tuner is None else {"budget": d.tuner.budget, "reason": d.tuner.reason})
        requests.append(info)
        return root

    step = Decoder.step

    def logged_step(self):
        req = requests[-1]
        before = (self._dev_cur is not None, self._dev_off, self.cache.seq_len)
        ready = self._device_ready() if self.drafter is not None and self._dev_cur is None else None
        out = step(self)
        if len(req["steps"]) < args.max_steps_logged:
            row = {"in_flight_before": before[0], "dev_off_before": before[1], "seq_len": before[2], "ready": ready,
                   "in_flight_after": self._dev_cur is not None, "dev_off_after": self._dev_off, "tokens": len(out)}
            d = self.drafter
            if d is not None:
                row.update(pending_rows=sum(r.shape[0] for r in d._pending), draft_len=d.cache.length,
                           budget=None if d.tuner is None else d.tuner.budget,
                           reason=None if d.tuner is None else d.tuner.reason[:120])
                if self._dev is not None:
                    row["room"] = self._dev.room(self.cache.seq_len, self.cache.max_len)
                    row["dev_run"] = [round(v, 6) if isinstance(v, float) else v for v in self._dev_run]
            req["steps"].append(row)
        req["total_steps"] = req.get("total_steps", 0) + 1
        req["stats"] = {"passes": self.stats.passes, "tau": self.stats.as_dict()["tau"]}
        return out

    verify = decoder_mod.verify
    failures: list[dict] = []

    def checked_verify(tree, logits, params, generator, argmax=None):
        n = tree.num_nodes
        bad = torch.nonzero(~torch.isfinite(logits[:n].float()).all(-1)).flatten().tolist()
        if bad and not failures:
            failures.append({"request": len(requests) - 1, "step": requests[-1].get("total_steps", 0), "nodes": n,
                             "bad_rows": bad, "nan_rows": torch.nonzero(logits[:n].isnan().any(-1)).flatten().tolist(),
                             "logits_rows": int(logits.shape[0]), "token_ids": tree.token_ids.tolist()[:64],
                             "parents": list(tree.parents)[:64], "max_vocab_id": int(tree.token_ids.max())})
            Path(args.out).write_text(json.dumps({"requests": requests, "failures": failures}, indent=1))
        return verify(tree, logits, params, generator, argmax=argmax)

    Decoder.prefill, Decoder.step, decoder_mod.verify = logged_prefill, logged_step, checked_verify
    rc = None
    try:
        rc = cli_main(["bench", *extra])
    finally:
        Path(args.out).write_text(json.dumps({"rc": rc, "requests": requests, "failures": failures}, indent=1))
        print(f"[cli-probe] rc={rc}, {len(requests)} requests, failures: {len(failures)}; wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
