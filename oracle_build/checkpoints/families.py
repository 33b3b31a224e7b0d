"""Generated models: tiny checkpoints oracle-build writes itself, byte for byte the same on
every host, so a spec can pin their files' sha256 and nothing is downloaded.

``tiny-llama-v1`` (tinymodel.py) is the embedded default, its tensors listed by hand since
its first release (its bytes are pinned by the committed golden). Every other generator is
one kernel family of the numerics battery: its config.json is written here, but the names
and shapes of its tensors come from the architecture itself: transformers' model class,
instantiated on the meta device inside the oracle venv (inside/weights.py), its state dict
put back into the layout checkpoints use (one tensor per MoE expert, not transformers 5's
fused experts). The values are a pure function of (seed, generator, tensor name, index), so
a changed layout or a changed generator changes the files' hashes and the spec refuses
them (exit 13), never silently.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oracle_build.checkpoints import tiny
from oracle_build.core.errors import BadInput, EngineFailed, ModelMismatch
from oracle_build.core.files import atomic_write_bytes, load_json
from oracle_build.core.log import say
from oracle_build.oracle.venv import OracleVenv

LEGACY = tiny.NAME  # "tiny-llama-v1"

# Shared by every family: the size that keeps an engine start near its floor on 2 cores,
# and the tiny byte-level tokenizer (vocab 300) of the embedded default.
BASE: dict[str, Any] = {
    "hidden_size": 128,
    "vocab_size": tiny.VOCAB,
    "max_position_embeddings": tiny.MAX_POS,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
ATTENTION = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}


@dataclass(frozen=True)
class Family:
    """One generated architecture of the battery."""

    generator: str  # the name a spec's model.generate gives
    golden: str  # the battery golden's name
    architecture: str
    model_type: str
    dtype: str  # float32 | bfloat16
    exercises: str
    config: dict[str, Any] = field(default_factory=dict)
    embed_scale: float = 1.0  # tied embeddings (Gemma2) need a small one, or the model
    head_scale: float = 0.35  # only echoes its input token

    def config_json(self) -> dict[str, Any]:
        return {**BASE, **self.config, "architectures": [self.architecture],
                "model_type": self.model_type, "torch_dtype": self.dtype}


FAMILIES: tuple[Family, ...] = (
    Family("tiny-llama-bf16-v1", "llama-bf16", "LlamaForCausalLM", "llama", "bfloat16",
           "Llama in bfloat16: bf16 GEMMs and the bf16 rounding of logits, where real "
           "goldens see their near-ties and exact ties",
           {**ATTENTION, "num_hidden_layers": 2, "intermediate_size": 256,
            "rope_theta": 10000.0, "hidden_act": "silu"}),
    Family("tiny-qwen3-v1", "qwen3", "Qwen3ForCausalLM", "qwen3", "float32",
           "Qwen3: per-head RMSNorm on q and k before RoPE (q_norm, k_norm)",
           {**ATTENTION, "num_hidden_layers": 2, "intermediate_size": 256,
            "rope_theta": 1000000.0, "hidden_act": "silu"}),
    Family("tiny-qwen3-moe-v1", "qwen3-moe", "Qwen3MoeForCausalLM", "qwen3_moe", "float32",
           "Qwen3-MoE: router softmax, top-2 of 4 routed experts with normalised weights, "
           "the fused-MoE kernel, one checkpoint tensor per expert",
           {**ATTENTION, "num_hidden_layers": 2, "intermediate_size": 256,
            "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "rope_theta": 1000000.0, "hidden_act": "silu"}),
    Family("tiny-gemma2-v1", "gemma2", "Gemma2ForCausalLM", "gemma2", "float32",
           "Gemma2: attention-logit and final-logit soft-capping (caps 5 and 3, low enough "
           "to bend these logits), a 16-token sliding window "
           "on alternate layers (prompts and outputs run past it), GeGLU, tied embeddings, "
           "(1 + w) RMSNorm before and after each block",
           {**ATTENTION, "num_hidden_layers": 2, "intermediate_size": 256,
            "sliding_window": 16, "query_pre_attn_scalar": 64,
            "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
            "hidden_activation": "gelu_pytorch_tanh", "rope_theta": 10000.0,
            "tie_word_embeddings": True, "layer_types": ["sliding_attention",
                                                         "full_attention"]},
           embed_scale=0.05),
    Family("tiny-nemotron-h-v1", "nemotron-h", "NemotronHForCausalLM", "nemotron_h",
           "float32",
           "Nemotron-H hybrid (pattern M*M-): Mamba2 mixers (causal conv1d, selective scan "
           "with its SSM state, gated RMSNorm), an attention layer and a squared-ReLU MLP "
           "in one stack",
           {**ATTENTION, "num_hidden_layers": 4, "hybrid_override_pattern": "M*M-",
            "intermediate_size": 256, "mamba_num_heads": 4, "mamba_head_dim": 64,
            "n_groups": 1, "ssm_state_size": 16, "conv_kernel": 4, "chunk_size": 64,
            "mamba_hidden_act": "silu", "mlp_hidden_act": "relu2", "use_conv_bias": True,
            "use_bias": False, "layer_norm_epsilon": 1e-5, "residual_in_fp32": False}),
    Family("tiny-qwen3-next-v1", "qwen3-next", "Qwen3NextForCausalLM", "qwen3_next",
           "bfloat16",
           "Qwen3-Next: gated delta net linear attention (its recurrent state and short "
           "conv), gated full attention with partial RoPE, and MoE with a gated shared "
           "expert; bfloat16 and 128-wide heads, as vLLM's CPU GDN kernel requires",
           {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_num_key_heads": 1, "linear_num_value_heads": 2,
            "linear_conv_kernel_dim": 4, "partial_rotary_factor": 0.25,
            "intermediate_size": 256, "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64, "num_experts": 4,
            "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "rope_theta": 10000.0, "hidden_act": "silu"}),
)
BY_GENERATOR = {f.generator: f for f in FAMILIES}
NAMES = (LEGACY, *BY_GENERATOR)


def values(generator: str, name: str, shape: list[int]) -> np.ndarray:
    """A tensor's float32 values: uniform in [-1, 1) from (seed, generator, name, index),
    scaled by what the tensor is (by its name and shape, for every architecture alike):
    embeddings and the LM head by the family's scales, other matrices by 1/sqrt(fan-in)
    (unit variance through a layer), norms near 1, Mamba/GDN decay and step parameters in
    their stable ranges, biases small."""
    family = BY_GENERATOR[generator]
    count = math.prod(shape)
    u = tiny.uniform(f"{generator}:{name}", count).reshape(shape)
    leaf = name.rsplit(".", 1)[-1] if name.endswith((".weight", ".bias")) else name
    base = name.rsplit(".", 2)[-2] if name.endswith((".weight", ".bias")) else ""
    if len(shape) >= 2:
        if base in ("embed_tokens", "embeddings"):
            scale = family.embed_scale
        elif base == "lm_head":
            scale = family.head_scale
        else:
            scale = math.sqrt(3.0 / math.prod(shape[1:]))
        return u * np.float32(scale)
    if leaf == "bias":
        return u * np.float32(0.1)
    if "norm" in base or leaf == "D":
        return np.float32(1.0) + np.float32(0.1) * u
    if leaf in ("A_log", "dt_bias"):
        return np.float32(0.5) * u
    return u * np.float32(0.1)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even (as torch rounds)."""
    bits = np.ascontiguousarray(x, dtype="<f4").view(np.uint32)
    rounding = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    out: np.ndarray = ((bits + rounding) >> np.uint32(16)).astype("<u2")
    return out


def family_files(family: Family, tensors: dict[str, list[int]]) -> dict[str, bytes]:
    arrays = {}
    for name, shape in tensors.items():
        x = values(family.generator, name, shape)
        arrays[name] = to_bf16_bits(x) if family.dtype == "bfloat16" else x
    files = tiny.files()
    files["config.json"] = tiny.json_bytes(family.config_json())
    files["model.safetensors"] = tiny.safetensors_bytes(arrays, generator=family.generator)
    return files


# ----------------------------------------------------------------------------- layouts


def _layout_cache(home: Path, family: Family, transformers: str) -> Path:
    key = hashlib.sha256(tiny.json_bytes(family.config_json())).hexdigest()[:16]
    return home / "models" / ".layouts" / transformers / f"{family.generator}-{key}.json"


def _cached_layout(path: Path) -> dict[str, Any] | None:
    """A cached layout, or None when there is none or it is not whole (read again)."""
    if not path.exists():
        return None
    try:
        data = load_json(path)
    except BadInput as exc:
        say(f"    ignoring a damaged layout cache ({exc.problems[0][1]}): {path}")
        return None
    tensors = data.get("tensors") if isinstance(data, dict) else None
    if not isinstance(tensors, dict) or not all(
            isinstance(s, list) and all(isinstance(d, int) and d > 0 for d in s)
            for s in tensors.values()):
        say(f"    ignoring a damaged layout cache (no tensors table): {path}")
        return None
    return dict(data)


def layouts(families: list[Family], venv: OracleVenv, transformers: str,
            home: Path) -> dict[str, dict[str, Any]]:
    """Each family's checkpoint layout as the oracle's transformers defines it, cached per
    transformers version and config (one run inside the venv for all that are missing)."""
    out: dict[str, dict[str, Any]] = {}
    missing = []
    for family in families:
        cached = _cached_layout(_layout_cache(home, family, transformers))
        if cached is not None:
            out[family.generator] = cached
        else:
            missing.append(family)
    if missing:
        say(f"    reading the layout of {', '.join(f.generator for f in missing)} from "
            f"transformers {transformers} in {venv.path}")
        answer = venv.run_inside("weights.py", [], request={"configs": {
            f.generator: f.config_json() for f in missing}}, echo=False,
            what="read model layouts", timeout=600)
        data = answer.data or {}
        if not data.get("ok"):
            raise EngineFailed("the oracle's transformers could not instantiate "
                               f"{', '.join(f.generator for f in missing)}: "
                               f"{data.get('error') or answer.result.output[-2000:]}",
                               hint=str(data.get("traceback") or "")[-1500:] or None)
        if data.get("transformers") != transformers:
            raise EngineFailed(f"the oracle venv has transformers {data.get('transformers')}, "
                               f"its identity says {transformers}")
        for family in missing:
            layout = data["models"][family.generator]
            if layout["class"] != family.architecture:
                raise EngineFailed(f"{family.generator}: transformers built "
                                   f"{layout['class']}, not {family.architecture}")
            cache = _layout_cache(home, family, transformers)
            atomic_write_bytes(cache, tiny.json_bytes(layout))
            out[family.generator] = layout
    return out


def generate(name: str, dest: Path, *, home: Path, venv: OracleVenv | None = None,
             transformers: str | None = None) -> dict[str, str]:
    """Write generator ``name``'s files into ``dest`` (each atomically, only when its bytes
    differ); return {file: sha256}. The battery's generators need the oracle venv whose
    transformers defines their layout."""
    if name == LEGACY:
        return tiny.generate(dest)
    family = BY_GENERATOR.get(name)
    if family is None:
        raise ModelMismatch(f"no generator {name!r} (known: {', '.join(NAMES)})")
    if venv is None or not transformers:
        raise ModelMismatch(f"generator {name} reads its layout from an oracle's "
                            "transformers; no oracle was given")
    layout = layouts([family], venv, transformers, home)[family.generator]
    return tiny.write_files(dest, family_files(family, layout["tensors"]))
