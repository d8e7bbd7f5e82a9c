"""A tiny random target saved as a Hugging Face directory (byte-level tokenizer + ChatML template),
for CPU smoke runs of train-drafter (tests and `bench/train_default_drafter_gpu.sh --smoke`)."""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_tokenizer():
    """256 byte tokens (no merges) + 3 specials: any text encodes; ids 0..258."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {s: i for i, s in enumerate(SPECIALS)} | {ch: len(SPECIALS) + i for i, ch in enumerate(sorted(alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": list(SPECIALS)})
    tok.chat_template = CHATML
    return tok


def save_tiny_target(path: str | Path, num_layers: int = 6, hidden: int = 64, seed: int = 0) -> Path:
    """A random llama (vocab 260: the byte tokenizer's 259 ids + one spare row) in `path`."""
    import transformers as tf

    path = Path(path)
    tok = byte_tokenizer()
    cfg = tf.LlamaConfig(vocab_size=len(tok) + 1, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, rope_theta=10000.0)
    return save_random_model(cfg, tok, path, seed)


def save_random_model(cfg, tok, path: str | Path, seed: int = 0) -> Path:
    """transformers' model for `cfg`, every weight nudged by N(0, 0.05), saved with `tok` in `path`."""
    import transformers as tf

    path = Path(path)
    torch.manual_seed(seed)
    hf = tf.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return path
