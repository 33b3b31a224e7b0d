"""The embedded default model: a tiny Llama the tool generates, byte for byte the same
on every host, so its files' sha256 can be pinned in the golden's spec.

Weights come from a counter-based generator (splitmix64 over the tensor name and the
element index), not from numpy's ``Generator`` whose algorithms may change between
releases. The tokenizer is a byte-level BPE written here, so nothing is downloaded.
Architecture: 2 layers, hidden 128, 2 heads of head_dim 64 (vLLM's CPU attention
refuses head_dim 16), 1 KV head, vocab 300, float32.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from oracle_build.core import safetensors
from oracle_build.core.files import atomic_write_bytes, sha256_file

NAME = "tiny-llama-v1"
SEED = 20261129
HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 2
KV_HEADS = 1
HEAD_DIM = 64
VOCAB = 300
SPECIALS = ["<unk>", "<s>", "</s>"]
MAX_POS = 1024

# Frequent English byte pairs, merged in this order (41 merges fill the vocab to 300).
MERGE_TEXT = (
    "t h|th e|Ġ t|Ġ a|i n|e r|Ġ s|o n|a n|r e|Ġ o|Ġ w|e n|a t|Ġ c|o r|Ġ the|e s|i s|i t|"
    "Ġ f|Ġ p|Ġ b|a l|e d|Ġ m|in g|a r|o u|Ġ in|Ġ d|l e|Ġ h|i c|a s|Ġo f|Ġa n|Ġt o|Ġ l|s t|Ġ is"
)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: np.ndarray = x ^ (x >> np.uint64(31))
        return out


def uniform(name: str, count: int) -> np.ndarray:
    """``count`` floats in [-1, 1), a pure function of (SEED, name, index)."""
    key = int.from_bytes(hashlib.sha256(f"{SEED}:{name}".encode()).digest()[:8], "little")
    idx = np.arange(count, dtype=np.uint64) + np.uint64(key)
    bits = _splitmix64(idx) >> np.uint64(40)  # 24 random bits
    out: np.ndarray = (bits.astype(np.float64) / float(1 << 23) - 1.0).astype(np.float32)
    return out


def _tensors() -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}

    def mat(name: str, rows: int, cols: int, scale: float) -> None:
        out[name] = (uniform(name, rows * cols) * np.float32(scale)).reshape(rows, cols)

    def norm(name: str) -> None:
        out[name] = (np.float32(1.0) + np.float32(0.1) * uniform(name, HIDDEN))

    mat("model.embed_tokens.weight", VOCAB, HIDDEN, 1.0)
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        fan = 1.0 / np.sqrt(HIDDEN) * np.sqrt(3.0)
        mat(f"{p}.self_attn.q_proj.weight", HEADS * HEAD_DIM, HIDDEN, fan)
        mat(f"{p}.self_attn.k_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN, fan)
        mat(f"{p}.self_attn.v_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN, fan)
        mat(f"{p}.self_attn.o_proj.weight", HIDDEN, HEADS * HEAD_DIM, fan)
        mat(f"{p}.mlp.gate_proj.weight", INTERMEDIATE, HIDDEN, fan)
        mat(f"{p}.mlp.up_proj.weight", INTERMEDIATE, HIDDEN, fan)
        mat(f"{p}.mlp.down_proj.weight", HIDDEN, INTERMEDIATE,
            1.0 / np.sqrt(INTERMEDIATE) * np.sqrt(3.0))
        norm(f"{p}.input_layernorm.weight")
        norm(f"{p}.post_attention_layernorm.weight")
    norm("model.norm.weight")
    mat("lm_head.weight", VOCAB, HIDDEN, 0.35)
    return out


def safetensors_bytes(tensors: dict[str, np.ndarray], *, generator: str = NAME) -> bytes:
    """A model's safetensors: float32 arrays are F32; uint16 arrays are bfloat16 bit
    patterns (BF16)."""
    return safetensors.to_bytes(
        {name: ("BF16" if arr.dtype == np.uint16 else "F32", arr)
         for name, arr in tensors.items()},
        {"format": "pt", "generator": generator})


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(
        range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def tokenizer_json() -> dict[str, Any]:
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIALS)}
    for _byte, ch in sorted(_bytes_to_unicode().items()):
        vocab[ch] = len(vocab)
    merges = MERGE_TEXT.split("|")
    for merge in merges:
        left, right = merge.split(" ")
        if left not in vocab or right not in vocab or left + right in vocab:
            raise AssertionError(f"merge {merge!r} does not build on the vocabulary so far")
        vocab[left + right] = len(vocab)
    assert len(vocab) == VOCAB, len(vocab)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i, tok in enumerate(SPECIALS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def config_json() -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def json_bytes(value: Any) -> bytes:
    """A generated JSON file's bytes: sorted keys, two-space indent, final newline."""
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def files() -> dict[str, bytes]:
    js = json_bytes
    return {
        "config.json": js(config_json()),
        "generation_config.json": js({"bos_token_id": 1, "eos_token_id": 2}),
        "model.safetensors": safetensors_bytes(_tensors()),
        "tokenizer.json": js(tokenizer_json()),
        "tokenizer_config.json": js({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
            "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": False,
            "add_eos_token": False, "model_max_length": MAX_POS,
        }),
        "special_tokens_map.json": js({"bos_token": "<s>", "eos_token": "</s>",
                                       "unk_token": "<unk>"}),
    }


def write_files(dest: Path, contents: dict[str, bytes]) -> dict[str, str]:
    """Write generated files into ``dest``, each atomically and only when its bytes differ;
    return {file: sha256}."""
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, data in contents.items():
        digest = hashlib.sha256(data).hexdigest()
        path = dest / name
        if not path.exists() or sha256_file(path) != digest:
            atomic_write_bytes(path, data)
        out[name] = digest
    return out


def generate(dest: Path) -> dict[str, str]:
    """Write the model into ``dest``; return {file: sha256}."""
    return write_files(dest, files())
