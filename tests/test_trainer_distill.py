"""On-policy distillation in the trainer (trainer/teacher.py, the score and update steps): a teacher on the
mesh read through the student's token ids, its own architecture and dtype, the metrics, the refusals
(tokenizer, resume with another teacher, config), and multi-turn masks."""
import jax
import numpy as np
import pytest

from fixtures_data import make_tiny_tokenizer
from jaxrl_llm import config as config_lib
from jaxrl_llm.data import load_tokenizer
from jaxrl_llm.models import init_params
from jaxrl_llm.models.hf import save_hf
from jaxrl_llm.trainer import Trainer
from jaxrl_llm.trainer.adapters import base_rng
from jaxrl_llm.trainer.setup import builtin_model_config
from jaxrl_llm.trainer.teacher import check_gkd_vocab, check_tokenizers, first_vocab_difference, load_teacher
from test_trainer import small_config


def save_teacher(path, c, seed=None, **dims):
    """A built-in model of `c` (with `dims` changed) as an HF directory with the built-in tokenizer;
    seed None: the student's own initial weights (the trainer's key for them)."""
    tok = load_tokenizer("")
    mc = builtin_model_config(c, tok).replace(**dims)
    key = base_rng(c.seed) if seed is None else jax.random.PRNGKey(seed)
    save_hf(str(path), mc, init_params(mc, key), tokenizer=tok)
    return str(path)


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    root, c = tmp_path_factory.mktemp("teachers"), small_config()
    return {"self": save_teacher(root / "self", c)}


def test_opd_with_the_student_as_its_own_teacher_has_zero_reverse_kl(teachers, tmp_path):
    """The teacher reads the very tokens the student sampled with the same conditioning: identical
    models give log-probs equal to the sampler's, hence a zero reverse KL and zero advantages."""
    c = small_config("opd", total_steps=1, **{"teacher.path": teachers["self"]})
    (m,) = Trainer(c, str(tmp_path)).run()
    assert abs(m["distill/reverse_kl"]) < 1e-4 and m["distill/teacher_logp_mean"] < -0.1
    assert abs(m["policy/loss"]) < 1e-5


def test_gkd_with_a_wider_teacher_and_the_resume_check(tmp_path):
    """A teacher of another width, depth and output size (padded past the tokenizer): gkd trains on a
    positive divergence; a resume whose teacher directory now holds other weights is refused."""
    vocab = len(load_tokenizer(""))  # the student's output size; the teacher's is padded past it
    c, wide = small_config(), dict(hidden_size=48, intermediate_size=96, num_layers=2, head_dim=12, vocab_size=vocab + 16)
    path = save_teacher(tmp_path / "teacher", c, seed=7, **wide)
    c = small_config("gkd", total_steps=1, **{"teacher.path": path, "distill.beta": 0.5})
    t = Trainer(c, str(tmp_path / "work"))
    assert t.teacher_mc.hidden_size == 48 and t.teacher_mc.num_layers == 2
    assert (t.mc.vocab_size, t.teacher_mc.vocab_size) == (vocab, vocab + 16)
    (m,) = t.run()
    assert m["distill/jsd"] > 1e-3 and np.isfinite(m["policy/grad_norm"]) and m["policy/grad_norm"] > 0
    save_teacher(tmp_path / "teacher", c, seed=8, **wide)  # same path and architecture, other weights
    c.total_steps = 2
    with pytest.raises(ValueError, match="distilled from another teacher"):
        Trainer(c, str(tmp_path / "work"))


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
    assert first_vocab_difference({"a": 0, "b": 1}, {"a": 0, "b": 1}) is None
    assert first_vocab_difference({"a": 0, "b": 1}, {"a": 0, "c": 1}) == "id 1 is 'b' for the student and 'c' for the teacher"
    assert "id 2 is None" in first_vocab_difference({"a": 0, "b": 1}, {"a": 0, "b": 1, "z": 2})
    other = make_tiny_tokenizer(str(tmp_path / "tok"), chat_template=False)
    with pytest.raises(ValueError, match=r"config.teacher.path T: its tokenizer differs from the student's \(id \d+ is"):
        check_tokenizers(load_tokenizer(""), other, "T")


def test_gkd_refuses_a_model_with_fewer_logits_than_tokens(tmp_path):
    """A tokenizer id without a logit in either model: one line (opd, which reads sampled ids only,
    is not concerned); equal or padded sizes pass."""
    check_gkd_vocab(64, 80, 60, "T")
    check_gkd_vocab(60, 60, 60, "T")
    for s, t in [(64, 59), (59, 80)]:
        with pytest.raises(ValueError, match=rf"config.teacher.path T: the tokenizer has 60 tokens but the student "
                                             rf"has {s} logits and the teacher {t}; distill.kind='gkd' needs"):
            check_gkd_vocab(s, t, 60, "T")
    import json
    from jaxrl_llm.models.config import config_to_hf_dict
    c, tok = small_config("gkd", **{"teacher.path": str(tmp_path)}), load_tokenizer("")
    c = config_lib.prepare(c)  # the gkd preset sets distill.kind
    mc = builtin_model_config(c, tok)  # load_teacher refuses before reading any weights: none written
    tok.save_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf_dict(mc.replace(vocab_size=len(tok) - 1), "float32")))
    with pytest.raises(ValueError, match=f"the tokenizer has {len(tok)} tokens but the student has {len(tok)} "
                                         f"logits and the teacher {len(tok) - 1}"):
        load_teacher(c, tok, mc, None, lambda path: path)
    # opd reads the sampled ids only, but any id the student can sample needs a teacher row
    c = config_lib.prepare(small_config("opd", **{"teacher.path": str(tmp_path)}))
    with pytest.raises(ValueError, match=f"the student has {len(tok)} logits and the teacher {len(tok) - 1}; the "
                                         "student could sample an id the teacher has no row for"):
        load_teacher(c, tok, mc, None, lambda path: path)


@pytest.mark.parametrize("fields, message", [
    ({"algo": "opd"}, "config.teacher.path must be a teacher model"),
    ({"algo": "grpo", "advantage.estimator": "none"}, "config.teacher.path must be a teacher model"),
    ({"algo": "gkd", "teacher.path": "t", "distill.beta": 1.5}, r"config.distill.beta must be in \[0, 1\]"),
    ({"algo": "gkd", "teacher.path": "t", "distill.vocab_chunk": 0}, "config.distill.vocab_chunk must be an int >= 1"),
    ({"algo": "opd", "teacher.path": "t", "distill.kind": "kd"}, "config.distill.kind must be one of opd, gkd"),
    ({"algo": "opd", "teacher.path": "t", "teacher.dtype": "int8"}, "config.teacher.dtype must be"),
])
def test_distillation_config_errors(fields, message):
    c = small_config()
    with pytest.raises(ValueError, match=message):
        config_lib.prepare(config_lib.from_dict(fields, c))



def test_demo_steps_to_the_bar_by_hand():
    """benchmarks/distill_demo.py's bar: initial reward (first 10 steps) + half the headroom to 1, reached
    at the first step whose trailing 10-step mean gets there; seconds = the steps' step_s up to it."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from distill_demo import to_bar
    rewards = [0.0] * 10 + [1.0] * 10  # trailing mean 0.5 first at step 15 (steps 6..15: five 1.0s)
    rows = [{"step": 0, "eval/pass@1": 0.0}] + [{"step": i + 1, "reward/mean": r, "perf/step_s": 2.0}
                                                for i, r in enumerate(rewards)]
    assert to_bar(rows) == (0.5, 15, 30.0)
    assert to_bar(rows, bar=0.95) == (0.95, 20, 40.0) and to_bar(rows, bar=1.5)[1:] == (None, None)


@pytest.mark.parametrize("beta, pad_s, pad_t", [(0.0, 0, 0), (0.5, 0, 16), (1.0, 8, 0)])
def test_gkd_through_the_models_equals_trl_on_transformers_logits(beta, pad_s, pad_t, tmp_path_factory):
    """The trainer's gkd path (steps.gkd_divergence: the student's and the teacher's hidden states, each
    model's head, the vocabulary scan) on a fixed batch of a Llama student and a wider Qwen2 teacher
    equals TRL's GKDTrainer.generalized_jsd_loss on the two transformers models' logits of the same
    [prompt; completion] rows, over the completion tokens of the mask, and a float64 loop. With output
    sizes padded differently (97 real ids; pad_s/pad_t extra logits, random like the rest, so their mass
    is large) both are taken on the first min(V_s, V_t) = 97 logits, each distribution renormalised there."""
    torch = pytest.importorskip("torch")
    gkd = pytest.importorskip("trl.experimental.gkd")
    from fixtures_hf import left_padded_batch, make_hf_model
    from jaxrl_llm import rl
    from jaxrl_llm.models import load_hf
    from jaxrl_llm.trainer.steps import gkd_divergence
    root = tmp_path_factory.mktemp("gkd_models")
    from test_rl_distill import jsd_loop
    hs = make_hf_model(str(root / "s"), "llama", seed=0, vocab_size=97 + pad_s)
    ht = make_hf_model(str(root / "t"), "qwen2", seed=1, hidden_size=48, intermediate_size=96, num_attention_heads=4,
                       vocab_size=97 + pad_t)
    (smc, sp), (tmc, tp) = load_hf(str(root / "s")), load_hf(str(root / "t"))
    rng = np.random.default_rng(0)
    prompts, pmask = left_padded_batch(rng, [5, 3], 97)
    G, T = 2, 4
    tokens = rng.integers(3, 97, size=(4, T)).astype(np.int32)
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], np.int32)
    b = {"prompt_tokens": prompts, "prompt_mask": pmask, "tokens": tokens, "mask": mask}
    o = rl.Objective(group_size=G, estimator="none", distill="gkd", distill_beta=beta, distill_chunk=16)
    _, _, div = gkd_divergence(smc, tmc, o, sp, tp, b, 0.8)
    ours = np.asarray(div)[mask > 0].mean()
    # transformers: each row as [prompt (real tokens); completion (real tokens)], logits predicting each
    # completion token (the position before it).
    s_rows, t_rows, labels = [], [], []
    for n in range(4):
        p = prompts[n // G][pmask[n // G] > 0]
        c = tokens[n][mask[n] > 0]
        ids = torch.tensor(np.concatenate([p, c])[None].astype(np.int64))
        with torch.no_grad():
            s_rows.append(hs(ids).logits[0, len(p) - 1:len(p) - 1 + len(c), :97])
            t_rows.append(ht(ids).logits[0, len(p) - 1:len(p) - 1 + len(c), :97])
        labels.append(torch.tensor(c.astype(np.int64)))
    s_logits, t_logits = torch.cat(s_rows)[None], torch.cat(t_rows)[None]
    want = gkd.GKDTrainer.generalized_jsd_loss(s_logits, t_logits, labels=torch.cat(labels)[None], beta=beta,
                                               temperature=0.8).item()
    np.testing.assert_allclose(ours, want, rtol=2e-4, atol=1e-6)
    loop = jsd_loop(s_logits.numpy().astype(np.float64), t_logits.numpy().astype(np.float64), beta, 0.8).mean()
    np.testing.assert_allclose(ours, loop, rtol=2e-4, atol=1e-6)


def test_multiturn_teacher_reads_the_observations_as_context(tmp_path):
    """Episodes with an environment: the student as its own teacher gives a zero reverse KL only if the
    teacher attends through the observations (attention_mask) exactly as the sampler did, while the
    distilled tokens are the model's alone (mask)."""
    from test_trainer_multiturn import mt_config
    c = mt_config("opd", total_steps=1)
    c.teacher.path = save_teacher(tmp_path / "teacher", c)
    (m,) = Trainer(c, str(tmp_path / "work")).run()
    assert m["env/turns/mean"] > 1  # observations were inserted between model turns
    assert abs(m["distill/reverse_kl"]) < 1e-4 and abs(m["policy/loss"]) < 1e-5
