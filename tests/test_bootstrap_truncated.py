"""PPO's bootstrap of truncated rows (advantage.bootstrap_truncated): V(s_T) is the value after the row's
last real token, unpacked and packed alike, also for a multi-turn episode cut short of T because its next
observation did not fit (issue 32). The reference is independent of the trainer's passes: the value model
run on each row's [prompt; completion] real tokens alone, read at its last position."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import sharding
from jaxrl_llm.models import value_head
from jaxrl_llm.models.lm import completion_hidden
from jaxrl_llm.models.value import value_forward
from jaxrl_llm.trainer import Trainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_trainer import small_config  # noqa: E402

T = 6
# Rows (completion columns): 1 model token, 0 environment token (attended, not trained), . padding.
ROWS = ["111111",  # single-turn, cut at T: its bootstrap must not change
        "110011",  # a multi-turn episode filling T
        "11001.",  # cut short: the next observation did not fit after the model's turn
        "1100..",  # cut short right after an observation
        "111...",  # ended (EOS): not truncated, V(s_T) unused
        "1001..",  # cut short
        "11....",  # cut short
        "111111"]  # single-turn, cut at T
TRUNCATED = [1, 1, 1, 1, 0, 1, 1, 1]


def episode_batch(t: Trainer) -> dict:
    """A rollout of the trainer's policy, re-masked into the multi-turn rows above (the tokens are the
    rollout's; the environment's tokens are just tokens the model attends to)."""
    local, _, _ = t.rollouts.collect(t.state.params, jax.random.PRNGKey(3))
    rows = ROWS
    local["mask"] = np.array([[ch == "1" for ch in r] for r in rows], np.int32)
    local["attention_mask"] = np.array([[ch != "." for ch in r] for r in rows], np.int32)
    local["truncated"] = np.array(TRUNCATED, bool)
    local["valid"] = np.ones(len(rows), np.float32)  # every row trained, so packed too
    return t.rollouts.device_batch(local)


def reference_last_values(mc, vparams, b) -> np.ndarray:
    """(N,) the value model on [prompt; completion up to its last attended token], at that last token."""
    pt, pm = np.asarray(b["prompt_tokens"]), np.asarray(b["prompt_mask"])
    ct, am = np.asarray(b["tokens"]), np.asarray(b["attention_mask"])
    G = len(ct) // len(pt)
    out = []
    for n in range(len(ct)):
        ext = int(np.nonzero(am[n])[0].max()) + 1
        seq = np.concatenate([pt[n // G][pm[n // G] > 0], ct[n, :ext]])[None]
        out.append(float(value_forward(mc, vparams, jnp.asarray(seq), jnp.ones_like(seq))[0, -1]))
    return np.array(out)


def bootstrap_values(t: Trainer):
    """(reference, unpacked, packed) V(s_T) of the truncated rows of `episode_batch`, and the batch."""
    b = episode_batch(t)
    # The value head starts at zero (V = 0 everywhere): give it weights that read the hidden state.
    keys = iter(jax.random.split(jax.random.PRNGKey(1), 64))
    noisy = jax.tree_util.tree_map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype),
                                   t.state.value_params)
    state = t.state.replace(value_params=noisy)
    ref = t.frozen_ref if state.ref_params is None else state.ref_params
    with sharding.use_mesh(t.mesh):
        unpacked = t.fns.score(state, ref, b)
        packed = t.fns.score(state, ref, b, t.packer.score(b))
    want = reference_last_values(t.mc, noisy, b) * np.array(TRUNCATED)
    return want, np.asarray(unpacked["last_values"]), np.asarray(packed["last_values"]), (noisy, b, unpacked, packed)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """PPO with the bootstrap and sequence packing (pack_length > 0: the score pass takes both layouts)."""
    c = small_config("ppo", **{"rollout.group_size": 2, "rollout.max_new_tokens": T, "train.pack_length": 32,
                               "advantage.bootstrap_truncated": True})
    return Trainer(c, str(tmp_path_factory.mktemp("bootstrap")))


def test_truncated_rows_bootstrap_from_the_value_after_their_last_token(trainer):
    want, unpacked, packed, (noisy, b, out_u, out_p) = bootstrap_values(trainer)
    assert np.all(np.abs(want[np.array(TRUNCATED) > 0]) > 1e-3)  # a value head that reads the state
    np.testing.assert_allclose(unpacked, want, atol=1e-5)
    np.testing.assert_allclose(packed, want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out_p["old_values"]), np.asarray(out_u["old_values"]), atol=1e-5)
    # Rows filling T (single-turn truncations among them) read what the score pass always read: the
    # state after column T-1's token, from a pass with one more column; the rows cut short do not.
    mc = trainer.mc
    ext = lambda x, v: jnp.pad(x, ((0, 0), (0, 1)), constant_values=v)
    old = np.asarray(value_head(mc, noisy, completion_hidden(mc, noisy["backbone"], b["prompt_tokens"],
                                                             b["prompt_mask"], ext(b["tokens"], 0),
                                                             ext(b["attention_mask"], 1))))[:, -1]
    full = np.array(["." not in r for r in ROWS])
    np.testing.assert_allclose(unpacked[full], old[full], atol=1e-5)
    cut = ~full & (np.array(TRUNCATED) > 0)
    assert np.all(np.abs(unpacked[cut] - old[cut]) > 1e-4)
