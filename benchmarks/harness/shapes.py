"""Model shapes of the benchmarks and the same random weights on both sides: toy and small decoders, and the
real shapes of SmolLM2-135M, Qwen2.5-0.5B and Qwen2.5-1.5B (configs written here, nothing downloaded);
a word-level tokenizer, random prompts, and stop-id sets that give heavy-tailed completion lengths."""
from __future__ import annotations

import dataclasses
import json
import os


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """Dimensions of a benchmark decoder: Qwen2 (GQA, q/k/v biases) or Llama (no biases)."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    model_type: str = "qwen2"
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6


def _size(name, v, h, m, layers, heads, kv, **kw) -> ModelSize:
    return ModelSize(name, vocab_size=v, hidden_size=h, intermediate_size=m, num_layers=layers, num_heads=heads,
                     num_kv_heads=kv, **kw)


SIZES = {s.name: s for s in (
    _size("toy", 256, 32, 64, 2, 4, 2),
    _size("gpu-toy", 512, 64, 128, 2, 4, 2, tie_word_embeddings=True),  # the GPU suite's dry run
    _size("3M", 8192, 128, 512, 4, 4, 2),
    _size("30M", 16384, 384, 1536, 8, 6, 2),
    # Real shapes, random weights (float32 on the CPU: 135M is 0.54 GB of weights, 0.5B 2.0 GB, 1.5B 6.2 GB).
    _size("135M", 49152, 576, 1536, 30, 9, 3, model_type="llama", tie_word_embeddings=True, rope_theta=1e5,
          rms_norm_eps=1e-5),  # SmolLM2-135M
    _size("0.5B", 151936, 896, 4864, 24, 14, 2, tie_word_embeddings=True, rope_theta=1e6),  # Qwen2.5-0.5B
    _size("1.5B", 151936, 1536, 8960, 28, 12, 2, tie_word_embeddings=True, rope_theta=1e6),  # Qwen2.5-1.5B
)}
REAL = ("135M", "0.5B", "1.5B")


def size_of(name: str) -> ModelSize:
    """The shape called `name`, with a one-line error naming the known ones."""
    if name not in SIZES:
        raise ValueError(f"--size must be one of {', '.join(SIZES)}, got {name!r}")
    return SIZES[name]


def hf_config(size: ModelSize, *, max_positions: int):
    """The transformers config of `size`: no EOS token (so `generate` runs every row to max_new_tokens), pad 0."""
    from transformers import LlamaConfig, Qwen2Config
    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[size.model_type]
    return cls(vocab_size=size.vocab_size, hidden_size=size.hidden_size, intermediate_size=size.intermediate_size,
               num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
               num_key_value_heads=size.num_kv_heads, max_position_embeddings=max_positions,
               tie_word_embeddings=size.tie_word_embeddings, rms_norm_eps=size.rms_norm_eps,
               rope_parameters={"rope_type": "default", "rope_theta": size.rope_theta},
               bos_token_id=None, eos_token_id=None, pad_token_id=0)


def build_models(path: str, size: ModelSize, *, seed: int = 0, max_positions: int = 1024):
    """Saves a random transformers model of `size` to `path` and loads the same weights into JAX.
    Returns (torch model in eval mode, float32; jaxrl_llm ModelConfig; params)."""
    import torch
    from transformers import AutoModelForCausalLM

    from jaxrl_llm.models import load_hf
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(size, max_positions=max_positions))
    with torch.no_grad():
        # Larger weights than HF's init so the sampled distribution is far from uniform, as in a trained LM.
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.05 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(path)
    config, params = load_hf(path)
    n_torch = sum(p.numel() for p in model.parameters())
    if n_torch != config.num_params():
        raise RuntimeError(f"parameter count mismatch: transformers {n_torch} vs jaxrl_llm {config.num_params()}")
    return model, config, params


def save_random_checkpoint(path: str, size: ModelSize, *, max_positions: int, seed: int = 0):
    """A random checkpoint of `size` (HF layout, via `save_hf`; no torch needed). Returns its ModelConfig."""
    import jax

    from jaxrl_llm.models import ModelConfig, init_params, save_hf
    from jaxrl_llm.models.config import RopeConfig
    config = ModelConfig(model_type=size.model_type, vocab_size=size.vocab_size, hidden_size=size.hidden_size,
                         intermediate_size=size.intermediate_size, num_layers=size.num_layers,
                         num_heads=size.num_heads, num_kv_heads=size.num_kv_heads,
                         head_dim=size.hidden_size // size.num_heads, max_position_embeddings=max_positions,
                         tie_word_embeddings=size.tie_word_embeddings, qkv_bias=size.model_type == "qwen2",
                         rms_norm_eps=size.rms_norm_eps, rope=RopeConfig(theta=size.rope_theta), pad_token_id=0)
    # Jitted: flax's init run eagerly compiles every op on its own (seconds at any size).
    save_hf(path, config, jax.jit(lambda key: init_params(config, key))(jax.random.PRNGKey(seed)))
    return config


PAD, EOS = "<pad>", "<eos>"  # ids 0 and 1; word w<i> has id i


def make_tokenizer(vocab_size: int):
    """A word-level tokenizer: `<pad>` 0, `<eos>` 1, then `w2` .. `w<V-1>`, split on whitespace, no
    special token added on encode: a prompt of k words is exactly k tokens in every library."""
    import tokenizers
    import transformers
    from tokenizers import models, pre_tokenizers
    vocab = {PAD: 0, EOS: 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, eos_token=EOS)


def write_prompts(path: str, vocab_size: int, num_prompts: int, prompt_len: int, seed: int = 0) -> None:
    """`num_prompts` lines {"prompt": "w.. w.."} of `prompt_len` random words (= tokens) to `path`."""
    import numpy as np
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(num_prompts):
            f.write(json.dumps({"prompt": " ".join(f"w{i}" for i in rng.integers(2, vocab_size, prompt_len))}) + "\n")


def write_stop_ids(model_dir: str, stop: list[int]) -> None:
    """Writes `stop` as generation_config.json's `eos_token_id` list, which TRL and jaxrl_llm both read."""
    path = os.path.join(model_dir, "generation_config.json")
    gen = json.load(open(path)) if os.path.exists(path) else {}
    with open(path, "w") as f:
        json.dump({**gen, "eos_token_id": stop}, f)


# ------------------------------------------------------------------------------ pure helpers (tested)
def eos_set_for_median(mass, median: float, *, exclude=(0,)) -> list[int]:
    """The smallest set of token ids whose mean next-token probability gives a geometric length with the
    given median: per-step stop probability h = 1 - 2**(-1/median), and the ids are taken in order of
    `mass` (mean probability of each id over many contexts, shape (V,)) closest to uniform first, so that
    no single id dominates. Returns sorted ids, never one in `exclude` (the pad id)."""
    import numpy as np
    mass = np.asarray(mass, np.float64)
    if median < 1:
        raise ValueError(f"median must be >= 1 token, got {median}")
    hazard = 1.0 - 2.0 ** (-1.0 / median)
    order = [i for i in np.argsort(np.abs(mass - np.median(mass)), kind="stable") if i not in set(exclude)]
    total = np.cumsum(mass[order])
    k = int(np.searchsorted(total, hazard)) + 1
    if k > len(order):
        raise ValueError(f"no set of ids reaches a stop probability of {hazard:.3g} per step")
    return sorted(int(i) for i in order[:k])


def completion_lengths(tokens, stop_ids, cap: int):
    """(rows,) lengths of completions (rows, T) ending at the first id of `stop_ids` (counted), else `cap`."""
    import numpy as np
    tokens = np.asarray(tokens)
    hit = np.isin(tokens, np.asarray(sorted(stop_ids)))
    first = np.where(hit.any(1), hit.argmax(1) + 1, min(cap, tokens.shape[1]))
    return np.minimum(first, cap)


def length_summary(lengths) -> dict:
    """min, p10, median, p90, max, mean and sum of completion lengths."""
    import numpy as np
    x = np.asarray(lengths)
    return {"min": int(x.min()), "p10": float(np.percentile(x, 10)), "median": float(np.median(x)),
            "p90": float(np.percentile(x, 90)), "max": int(x.max()), "mean": float(x.mean()), "sum": int(x.sum())}


def hf_dict(size: ModelSize, *, max_positions: int = 32768) -> dict:
    """`size` as the config.json fields `config_from_hf_dict` reads (memory_plan.py plans from shapes alone)."""
    return {"model_type": size.model_type, "vocab_size": size.vocab_size, "hidden_size": size.hidden_size,
            "intermediate_size": size.intermediate_size, "num_hidden_layers": size.num_layers,
            "num_attention_heads": size.num_heads, "num_key_value_heads": size.num_kv_heads,
            "rms_norm_eps": size.rms_norm_eps, "max_position_embeddings": max_positions, "rope_theta": size.rope_theta,
            "tie_word_embeddings": size.tie_word_embeddings, "hidden_act": "silu", "eos_token_id": 1}
