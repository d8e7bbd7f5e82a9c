"""Training sequences: prompts answered by the target itself, or ready text, stored as safetensors.

The drafter must learn the target's own outputs (a drafter trained on someone else's text
guesses tokens the target would not write), so the default data is regenerated: every prompt
is rendered with the target's chat template and answered by the target, greedily (or at a low
temperature), in large batches. `--data FILE` takes ready sequences instead.

A Dataset is flat token ids plus offsets; `response_start[i]` is where sequence i's response
begins (anchors are drawn from there on). Saved as one safetensors file with JSON metadata, so
`--resume` never regenerates.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from treeflash.data.prompts import BenchPrompt
from treeflash.data.prompts import encode_prompt
from treeflash.errors import InvalidRequestError


@dataclass
class Dataset:
    tokens: torch.Tensor  # [total] int32, all sequences back to back
    offsets: torch.Tensor  # [num + 1] int64, sequence i = tokens[offsets[i]:offsets[i+1]]
    response_start: torch.Tensor  # [num] int64, first response position within sequence i
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def sequence(self, i: int) -> torch.Tensor:
        return self.tokens[int(self.offsets[i]) : int(self.offsets[i + 1])].long()

    def length(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    @property
    def response_tokens(self) -> int:
        lengths = self.offsets[1:] - self.offsets[:-1]
        return int((lengths - self.response_start).sum())

    def subset(self, indices: list[int]) -> "Dataset":
        return from_sequences([(self.sequence(i).tolist(), int(self.response_start[i])) for i in indices], dict(self.meta))

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        tmp = path.with_suffix(".tmp")
        save_file({"tokens": self.tokens, "offsets": self.offsets, "response_start": self.response_start}, str(tmp),
                  metadata={"meta": json.dumps(self.meta)})
        tmp.replace(path)

    @staticmethod
    def load(path: Path) -> "Dataset":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("meta", "{}"))
            return Dataset(f.get_tensor("tokens"), f.get_tensor("offsets"), f.get_tensor("response_start"), meta)


def pad_right(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """[S] 1-D token tensors -> ids [S, W] (zeros after each sequence) and attention mask [S, W] (1 = token)."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return ids, mask


def from_sequences(seqs: list[tuple[list[int], int]], meta: dict | None = None) -> Dataset:
    """[(token ids, response start)] -> Dataset."""
    lengths = torch.tensor([len(s) for s, _ in seqs], dtype=torch.long)
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    flat = [t for s, _ in seqs for t in s]
    return Dataset(torch.tensor(flat, dtype=torch.int32), offsets, torch.tensor([r for _, r in seqs], dtype=torch.long), meta or {})


def max_prompt_len(max_len: int, max_new_tokens: int) -> int:
    """The longest prompt generation takes: room is left for max_new_tokens (at most half of max_len)."""
    return max_len - min(max_new_tokens, max_len // 2)


def generate_dataset(
    twin,  # features.TargetTwin
    loaded,  # LoadedModel: the tokenizer and chat template
    prompts: list[BenchPrompt],
    max_tokens: int,  # stop once this many response tokens exist
    max_new_tokens: int = 512,
    batch_size: int = 256,
    max_len: int = 1024,  # prompt + response; longer prompts are skipped
    temperature: float = 0.0,
    time_limit_s: float | None = None,
    progress: bool = True,
    seed: int = 0,
    extra_passes: int = 0,
    extra_temperature: float = 0.8,
) -> Dataset:
    """The target answers `prompts` in batches (prompts of similar length together) until
    max_tokens response tokens, the prompts, or the time limit run out. With `extra_passes`, it
    then answers the prompts again, sampled at `extra_temperature` (new answers the target itself
    would give: more distinct training data from the same prompts), pass after pass."""
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    max_prompt = max_prompt_len(max_len, max_new_tokens)
    seqs: list[tuple[list[int], int]] = []
    counts: dict[str, int] = {}
    by_pass: list[int] = []
    unfinished = produced = 0
    last_batch_s = 0.0
    bar = tqdm(total=max_tokens, desc="generating", unit="tok", disable=not progress, smoothing=0.1)
    skipped = [0]
    stop = False
    for pass_i in range(1 + extra_passes):
        temp = temperature if pass_i == 0 else extra_temperature
        by_pass.append(0)
        for batch in _batches(prompts, loaded, batch_size, max_prompt, skipped if pass_i == 0 else [0]):
            if produced >= max_tokens:
                stop = True
                break
            if time_limit_s is not None and time.perf_counter() - t0 + last_batch_s > time_limit_s:
                stop = True
                break  # the next batch would end past the limit
            t_batch = time.perf_counter()
            longest = max_prompt if getattr(twin, "static_shape", None) else max(len(ids) for _, ids in batch)
            new = min(max_new_tokens, max_len - longest)  # with a static shape: the same for every call
            outs = twin.generate([ids for _, ids in batch], new, temp, seed + 1_000_003 * pass_i + len(seqs))
            last_batch_s = time.perf_counter() - t_batch
            for (p, _), g in zip(batch, outs):
                if not g.response_ids:
                    continue
                seqs.append((g.prompt_ids + g.response_ids, len(g.prompt_ids)))
                source = p.name.split("/")[0] if "/" in p.name else "file"
                counts[source] = counts.get(source, 0) + len(g.response_ids)
                unfinished += not g.finished
                produced += len(g.response_ids)
                by_pass[-1] += len(g.response_ids)
                bar.update(len(g.response_ids))
        if stop:
            break
    bar.close()
    meta = {
        "kind": "generated",
        "sequences": len(seqs),
        "response_tokens": produced,
        "tokens_by_source": counts,
        "prompts_skipped_too_long": skipped[0],
        "responses_cut_at_max_new_tokens": unfinished,
        "temperature": temperature,
        "extra_passes": extra_passes,
        "extra_temperature": extra_temperature if extra_passes else None,
        "tokens_by_pass": by_pass,
        "max_new_tokens": max_new_tokens,
        "seconds": round(time.perf_counter() - t0, 1),
        "tokens_per_s": round(produced / max(time.perf_counter() - t0, 1e-9), 1),
    }
    if not seqs:
        raise InvalidRequestError("the target produced no training data (no prompts fit max_len?)", "prompts")
    return from_sequences(seqs, meta)


def prompt_groups(data: Dataset) -> list[list[int]]:
    """Sequence indices grouped by identical prompt (the tokens before the response), in order of
    first appearance: the answers of one prompt from several passes form one group."""
    groups: dict[object, list[int]] = {}
    for i in range(len(data)):
        start, n = int(data.offsets[i]), int(data.response_start[i])
        key = data.tokens[start : start + n].numpy().tobytes() if n else i  # plain text (no prompt): a group alone
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _batches(prompts: list[BenchPrompt], loaded, batch_size: int, max_prompt: int, skipped: list[int]):
    """Encoded prompts in batches; within chunks of 4 batches (of the shuffled list) sorted by
    length, so a batch pads little while every source stays mixed in."""
    for c in range(0, len(prompts), 4 * batch_size):
        encoded = []
        for p in prompts[c : c + 4 * batch_size]:
            ids = encode_prompt(loaded, p)
            if len(ids) > max_prompt:
                skipped[0] += 1
                continue
            encoded.append((p, ids))
        encoded.sort(key=lambda e: len(e[1]))
        for b in range(0, len(encoded), batch_size):
            yield encoded[b : b + batch_size]


def read_data(path: str | Path, loaded, max_len: int = 1024) -> Dataset:
    """Ready sequences. .jsonl rows: {"prompt", "completion"} (raw text), {"messages": [..., assistant]}
    (the last assistant message is the response), or {"text"} (all of it is response);
    .txt: the whole file as text, cut into max_len-token sequences."""
    p = Path(path)
    if not p.is_file():
        raise InvalidRequestError(f"--data {p}: no such file", "data")
    tok = loaded.tokenizer
    seqs: list[tuple[list[int], int]] = []
    if p.suffix.lower() == ".txt":
        ids = list(tok(p.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"])
        seqs = [(ids[i : i + max_len], 1) for i in range(0, len(ids), max_len) if len(ids[i : i + max_len]) > 2]
    elif p.suffix.lower() == ".jsonl":
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            try:
                seq = _row_sequence(json.loads(line), loaded)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise InvalidRequestError(f"--data {p.name}:{n + 1}: {e}", "data") from None
            ids, start = seq
            ids = ids[:max_len]
            if len(ids) - start >= 2:  # at least one anchor with a label
                seqs.append((ids, start))
    else:
        raise InvalidRequestError(f"--data {p}: use a .txt or .jsonl file", "data")
    if not seqs:
        raise InvalidRequestError(f"--data {p}: no usable sequences", "data")
    return from_sequences(seqs, {"kind": "file", "source": p.name, "sequences": len(seqs)})


def _row_sequence(row: dict, loaded) -> tuple[list[int], int]:
    tok = loaded.tokenizer
    if "messages" in row:
        messages = row["messages"]
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError("messages must end with the assistant's reply")
        prompt = encode_prompt(loaded, BenchPrompt("data", messages=tuple(messages[:-1])))
        reply = list(tok(messages[-1]["content"], add_special_tokens=False)["input_ids"])
        eos = getattr(tok, "eos_token_id", None)
        return prompt + reply + ([eos] if eos is not None else []), len(prompt)
    if "prompt" in row and "completion" in row:
        prompt = list(tok(row["prompt"], add_special_tokens=True)["input_ids"])
        return prompt + list(tok(row["completion"], add_special_tokens=False)["input_ids"]), len(prompt)
    if "text" in row:
        return list(tok(row["text"], add_special_tokens=True)["input_ids"]), 1
    raise ValueError('expected {"prompt", "completion"}, {"messages"} or {"text"}')


@dataclass
class Generated:
    prompt_ids: list[int]
    response_ids: list[int]  # the target's continuation, ending with its end token if it stopped
    finished: bool  # True when the target emitted an end token within max_new_tokens
