"""One GRPO step on a tiny Mistral, Gemma 2 and Gemma 3 text checkpoint through `model.path`: the trainer
loads the family, samples with its windowed decode step, updates, and the parameters move."""
import jax
import numpy as np
import pytest

from fixtures_data import make_tiny_tokenizer
from fixtures_families import FAMILIES, make_family_model
from jaxrl_llm.models import load_hf
from jaxrl_llm.trainer import Trainer
from test_trainer import small_config


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_grpo_step(family, tmp_path):
    path = str(tmp_path / "base")
    make_family_model(path, family, vocab_size=300)
    make_tiny_tokenizer(path, chat_template=False)
    t = Trainer(small_config(total_steps=1, **{"model.path": path, "rollout.max_new_tokens": 6}), str(tmp_path / "w"))
    t.run()
    assert t.mc.model_type == family and t.mc.sliding_window is not None
    _, before = load_hf(path)
    moved = jax.tree_util.tree_map(lambda a, b: float(np.abs(np.asarray(a, np.float32) - b).max()),
                                   t.state.params, before)
    assert max(jax.tree_util.tree_leaves(moved)) > 0
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(t.state.params))


# Gemma 2's chat template in substance: no system role (it raises), user/model turns.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")


def test_gemma_chat_template_renders_or_names_the_system_role(tmp_path):
    from jaxrl_llm.data.prompts import chat_prompt_texts, to_messages
    tok = make_tiny_tokenizer(str(tmp_path), chat_template=False)
    tok.chat_template = GEMMA_TEMPLATE
    texts = chat_prompt_texts(tok, [to_messages("2+2?", "")])
    assert texts[0].endswith("<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(ValueError, match=r"^the chat template failed on row 7: System role not supported$"):
        chat_prompt_texts(tok, [to_messages("2+2?", "Be brief.")], first_index=7)
