"""Grammars through llguidance (engine/grammar.py) and the tokenizer bridge (engine/token_bytes.py).

The bridge gives every token its exact bytes (a byte-level BPE from a GGUF included, where
llguidance's own reader takes "Ġ" for two bytes); the matcher's masks and rollback hold inside the
tree walk, so sampled speculation under a real regex grammar has the constrained target's
distribution (chi-square on an 8-token model); bad grammars are InvalidRequestErrors naming the field.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.spec.oracle_drafter import OracleDrafter
from tests.spec.test_sampled import PROMPT, chi2_quantile, chi_square, sharp_lm
from treeflash.engine.grammar import GrammarCompiler
from treeflash.engine.request import Grammar
from treeflash.engine.token_bytes import gpt2_byte_decoder, token_bytes
from treeflash.errors import InvalidRequestError
from treeflash.models.step import StepInput
from treeflash.spec.constraint import masked
from treeflash.spec.decoder import Decoder
from treeflash.spec.sampling import SamplingParams, target_probs

CHARS = "ab01,{}"  # token i < 7 is CHARS[i]; 7 is the end of sequence
EOS = 7


class CharTokenizer:
    eos_token_id = EOS
    bos_token_id = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [CHARS.index(c) for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(CHARS[i] if i < len(CHARS) else "" for i in ids)


def char_compiler() -> GrammarCompiler:
    return GrammarCompiler(CharTokenizer(), 8, [EOS])


def test_gpt2_byte_table_is_a_bijection_onto_bytes():
    table = gpt2_byte_decoder()
    assert sorted(table.values()) == list(range(256)) and table["Ġ"] == 32 and table["Ċ"] == 10 and table["a"] == 97


def test_bad_grammars_name_their_field():
    compiler = char_compiler()
    cases = [Grammar("regex", "(unclosed", "structured_outputs.regex"),
             Grammar("json_schema", json.dumps({"not": {"type": "string"}}), "response_format.json_schema.schema"),
             Grammar("grammar", "start: undefined_rule", "guided_grammar")]
    for g in cases:
        with pytest.raises(InvalidRequestError) as e:
            compiler.check(g)
        assert e.value.param == g.param and g.param in str(e.value)
    with pytest.raises(InvalidRequestError):
        Grammar("xml", "<a/>")
    compiler.check(Grammar("regex", "a[01]+"))  # a good one passes


def test_the_matcher_masks_advances_and_rolls_back():
    c = char_compiler().constraint(Grammar("regex", "a[01]+"))
    allowed = lambda: [CHARS[i] if i < 7 else "EOS" for i in c.allowed().nonzero().flatten().tolist()]  # noqa: E731
    assert allowed() == ["a"] and c.accepts(0) and not c.accepts(1)
    c.advance(0)
    assert allowed() == ["0", "1"]
    c.advance(2)
    assert allowed() == ["0", "1", "EOS"]  # accepting: the end token is allowed
    c.rollback(1)
    assert allowed() == ["0", "1"]
    c.reset()
    assert allowed() == ["a"]


REGEX = "[ab][01]{1,3}"  # the end token is allowed once a digit is out, and forced after three


@torch.inference_mode()
def exact_joint(model, params, n):
    """P(first n tokens) of plain decoding constrained by REGEX, by enumeration (re.fullmatch as the oracle
    of which tokens may follow); tokens after the end token are the unconstrained target's."""
    def allowed(prefix):
        if EOS in prefix:
            return None
        text = CharTokenizer().decode(list(prefix))
        ok = [t for t in range(7) if any(re.fullmatch(REGEX, text + CHARS[t] + tail) for tail in ("", "0", "00"))]
        mask = torch.zeros(8, dtype=torch.bool)
        mask[ok + ([EOS] if re.fullmatch(REGEX, text) else [])] = True
        return mask

    dist = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for prefix, p in dist.items():
            seq = PROMPT + list(prefix)
            logits = model(StepInput.plain(torch.tensor(seq), 0), model.new_cache(len(seq))).logits[-1:]
            for tok, qt in enumerate(target_probs(masked(logits, allowed(prefix)), params)[0].tolist()):
                if qt > 0:
                    nxt[prefix + (tok,)] = p * qt
        dist = nxt
    return dist


def test_sampled_speculation_under_a_regex_has_the_constrained_distribution():
    target, params, n, runs = sharp_lm(0), SamplingParams(temperature=1.0), 4, 1000
    constraint = char_compiler().constraint(Grammar("regex", REGEX))
    dec = Decoder(target, target.new_cache(len(PROMPT) + n + 16), params, OracleDrafter(target, depth=3, width=2, corrupt=0.3, vocab=8),
                  generator=torch.Generator().manual_seed(0), constraint=constraint, end_ids=frozenset({EOS}))
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(runs):
        out = [dec.prefill(PROMPT)]
        while len(out) < n:
            out.extend(dec.step())
        counts[tuple(out[:n])] = counts.get(tuple(out[:n]), 0) + 1
    assert dec.stats.accepted_per_depth[0] > 0
    stat, df = chi_square(counts, exact_joint(target, params, n), runs)
    assert stat < chi2_quantile(df, 1e-3), f"chi-square {stat:.1f}"


@pytest.mark.slow
def test_the_bridge_gives_the_default_tokenizers_exact_bytes():
    from treeflash.models.loader import load_model

    tok = load_model(None, device="cpu", progress=False).tokenizer
    vocab = len(tok) + 7  # an lm_head padded past the tokenizer: those ids are empty specials
    tokens, special = token_bytes(tok, vocab, [tok.eos_token_id])
    text = 'Hé said: {"a": [1, 2]}\n\n\tdone — 猫 🐍 <|im_end|>'
    ids = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert b"".join(tokens[i] for i in ids) == text.encode("utf-8")
    assert tok.eos_token_id in special and all(i in special for i in range(len(tok), vocab))
    assert tokens[tok.convert_tokens_to_ids("Ġ")] == b" " and tokens[tok.convert_tokens_to_ids("<|im_end|>")] == b"<|im_end|>"
