"""The OpenAI-compatible endpoint (envs/endpoint.py, `env.name=agent`) against the in-process
environment path: the same guess_digit episodes (the built-in task, the built-in tokenizer), once
with `GuessDigitEnv` stepping on the host and once with `jaxrl_llm.envs.agents:guess_digit` agents, one
thread each, calling the policy through the real `openai` client over localhost HTTP.

    python benchmarks/agent_endpoint.py                            # toy and 135M shapes, 1/8/64 agents
    python benchmarks/agent_endpoint.py --out docs/benchmarks.md   # also refresh the doc's results block
    python benchmarks/agent_endpoint.py --toy                      # seconds: keeps the script from rotting

Each measurement is one `sample_episodes` call over N episodes (N = the concurrent agents; 4 turns of
one token, each reply one token), both paths alternating (`harness.timing.time_interleaved`), the first
call (compilation) excluded; the script checks that both paths drew the same tokens. Overhead per turn:
(endpoint time - in-process time) / the batch's turns (the decode calls: every agent waiting at a turn
is served by the same call); per episode-turn: the same over every episode's turns. Episodes/s: N / time.
The model shapes: `toy` (harness.shapes) and `135M` (SmolLM2-135M's layers, random weights), both with
the built-in tokenizer's 100-token vocabulary.
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.report import machine_description, markdown_table, update_markdown  # noqa: E402
from harness.shapes import SIZES  # noqa: E402
from harness.timing import time_interleaved  # noqa: E402

from jaxrl_llm import envs  # noqa: E402
from jaxrl_llm.data import builtin_tokenizer  # noqa: E402
from jaxrl_llm.models.config import ModelConfig, RopeConfig  # noqa: E402
from jaxrl_llm.models.lm import init_params  # noqa: E402
from jaxrl_llm.trainer.episodes import sample_episodes  # noqa: E402

TURNS = 4


def model(size_name: str, vocab: int):
    s = SIZES[size_name]
    mc = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=s.hidden_size,
                     intermediate_size=s.intermediate_size, num_layers=s.num_layers, num_heads=s.num_heads,
                     num_kv_heads=s.num_kv_heads, head_dim=s.hidden_size // s.num_heads,
                     max_position_embeddings=64, rope=RopeConfig(theta=s.rope_theta), tie_word_embeddings=True)
    return mc, init_params(mc, jax.random.PRNGKey(0))


def measure(size_name: str, agents: int, repeats: int, tok):
    mc, params = model(size_name, len(tok))
    rows = [{"prompt": "guess:", "hidden": i % 10} for i in range(agents)]
    agent = envs.make_env("agent", {"agent": "jaxrl_llm.envs.agents:guess_digit", "chat": False, "timeout_s": 600})
    local = envs.make_env("guess_digit")
    kw = dict(max_turns=TURNS, max_new_tokens=2 * TURNS, max_turn_tokens=1, temperature=1.0,
              pad_id=tok.pad_token_id, max_workers=max(agents, 1))
    out = {}

    def run(name, env):
        def fn(i):
            out[name] = sample_episodes(mc, params, tok, env, rows, jax.random.PRNGKey(i), **kw)
            return out[name].tokens
        return fn

    t = time_interleaved({"in-process": run("in-process", local), "endpoint": run("endpoint", agent)},
                         repeats=repeats)
    agent.close()
    a, b = out["in-process"], out["endpoint"]  # the last repeat's (same key on both sides)
    if not (np.array_equal(a.tokens, b.tokens) and np.array_equal(a.rewards, b.rewards)):
        raise SystemExit(f"{size_name} x {agents}: the endpoint's episodes differ from the in-process ones")
    batch_turns = max(len(x) for x in a.texts)
    episode_turns = sum(len(x) for x in a.texts)
    gap = t["endpoint"].median - t["in-process"].median
    return {"size": size_name, "agents": agents, "inproc_s": t["in-process"].median, "endpoint_s": t["endpoint"].median,
            "per_turn_ms": 1e3 * gap / batch_turns, "per_episode_turn_ms": 1e3 * gap / episode_turns,
            "inproc_eps": agents / t["in-process"].median, "endpoint_eps": agents / t["endpoint"].median,
            "spread": max(t["in-process"].spread, t["endpoint"].spread)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="toy,135M")
    p.add_argument("--agents", default="1,8,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--toy", action="store_true", help="toy shape, 1 and 4 agents, 1 repeat")
    p.add_argument("--out", default="", help="a markdown file whose agent-endpoint block is rewritten")
    a = p.parse_args(argv)
    sizes, counts, repeats = a.sizes.split(","), [int(x) for x in a.agents.split(",")], a.repeats
    if a.toy:
        sizes, counts, repeats = ["toy"], [1, 4], 1
    tok = builtin_tokenizer()
    results = []
    for size_name in sizes:
        for n in counts:
            r = measure(size_name, n, repeats, tok)
            print(f"== {size_name} x {n} agents: in-process {r['inproc_s']:.3f} s, endpoint {r['endpoint_s']:.3f} s, "
                  f"overhead {r['per_turn_ms']:.2f} ms/turn, {r['endpoint_eps']:.1f} episodes/s", flush=True)
            results.append(r)
    table = markdown_table(
        ["shape", "agents", "in-process s", "endpoint s", "overhead ms / batch turn", "overhead ms / episode turn",
         "episodes/s in-process", "episodes/s endpoint", "spread"],
        [[r["size"], r["agents"], r["inproc_s"], r["endpoint_s"], r["per_turn_ms"], r["per_episode_turn_ms"],
          r["inproc_eps"], r["endpoint_eps"], r["spread"]] for r in results])
    body = (f"`python benchmarks/agent_endpoint.py` ({TURNS} turns of one token per episode, median of {repeats}; "
            f"{machine_description()}):\n\n{table}\n")
    print(body)
    if a.out:
        update_markdown(a.out, "agent-endpoint", body)


if __name__ == "__main__":
    main()
