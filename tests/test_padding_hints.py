"""The run names the settings that would skip the padding its lengths waste: `train.pack_length` when most
of the passes' completion columns are padding, `rollout.decode_shrink` / `decode_slots` when most of the
static decode's row-steps go to finished rows; once early in the log, and in the summary. Following a
hint gives a config that validates and silences it."""
import contextlib
import io
import logging

from jaxrl_llm import config as config_lib
from jaxrl_llm.trainer import Trainer, feedback

from test_trainer import small_config


def _config(**overrides):
    c = small_config(**{"rollout.batch_prompts": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 48,
                        "data.max_prompt_length": 512, "model.max_position_embeddings": 1024, **overrides})
    return config_lib.prepare(c)


def _rows(means, maxima, prompt=31):
    return [{"reward/mean": 0.0, "response_length/mean": a, "response_length/max": b,
             "data/prompt_length_max": float(prompt)} for a, b in zip(means, maxima)]


HEAVY = _rows([12.0, 10.0, 14.0], [48.0, 40.0, 48.0])  # median-10-of-48 lengths, as benchmarks/ draw them


def test_heavy_tailed_lengths_name_packing_and_the_decode_with_the_shares_worked_by_hand():
    pack, decode = feedback.padding_hints(_config(), HEAVY)
    # 1 - 12/48 = 75% padded columns; rows of the power of two holding the longest prompt (31) + 48 = 79.
    assert pack.startswith("75% of the completion columns the score and update passes ran were padding "
                           "(completions of 12.0 tokens on average, rollout.max_new_tokens=48)")
    assert "train.pack_length=128 with data.max_prompt_length=80 " in pack
    # The decode: 1 - (12 + 10 + 14) / (48 + 40 + 48) = 73.5% of the row-steps.
    assert decode.startswith("74% of the decode's row-steps went to rows that had already finished (the 16 rows")
    assert "rollout.decode_shrink=4" in decode


def test_following_the_hints_validates_and_silences_them():
    # Validated: pack_length >= max_prompt_length + max_new_tokens, and the shrink is allowed.
    c = _config(**{"train.pack_length": 128, "data.max_prompt_length": 80, "rollout.decode_shrink": 4})
    assert feedback.padding_hints(c, HEAVY) == []
    # A bound that the rows hold already is left as it is; a longer prompt takes longer rows.
    pack = feedback.padding_hints(_config(**{"data.max_prompt_length": 80}), HEAVY)[0]
    assert "train.pack_length=128 packs" in pack
    pack = feedback.padding_hints(_config(), _rows([12.0], [48.0], prompt=100))[0]
    assert "train.pack_length=256 with data.max_prompt_length=208 " in pack


def test_no_hint_where_little_is_padding_or_the_setting_cannot_apply():
    assert feedback.padding_hints(_config(), _rows([46.0, 47.5], [48.0, 48.0])) == []  # nearly uniform
    assert feedback.padding_hints(_config(), []) == []  # no step yet
    # Just under the share: 1 - 25/48 = 47.9% padded and 1 - 25/48 of the row-steps.
    assert feedback.padding_hints(_config(), _rows([25.0], [48.0])) == []
    only = lambda c: [h.split(" ", 1)[1][:20] for h in feedback.padding_hints(c, HEAVY)]
    assert only(_config(**{"train.pack_length": 640})) == ["of the decode's row-"]
    assert only(_config(**{"rollout.decode_slots": 8})) == ["of the completion co"]
    assert only(_config(**{"model.router_aux_loss_coef": 0.01})) == ["of the decode's row-"]  # packing refuses it
    assert only(_config(**{"rollout.batch_prompts": 2, "rollout.group_size": 2})) == ["of the completion co"]  # 4 rows
    assert feedback.padding_hints(_config(**{"rollout.max_new_tokens": 31}), _rows([3.0], [31.0])) == []
    assert len(feedback.padding_hints(_config(**{"rollout.max_new_tokens": 32}), _rows([3.0], [32.0]))) == 2
    # Every completion empty: all columns padding, but no step decoded anything finished (no division by a
    # zero maximum).
    hints = feedback.padding_hints(_config(), _rows([0.0], [0.0]))
    assert [h.split(" ", 1)[1][:20] for h in hints] == ["of the completion co"]


def test_the_summary_carries_the_hints():
    c = _config()
    text = feedback.summary(c, "/tmp/run", HEAVY, 3, None, 1.0, 2.0)
    hints = [line for line in text.splitlines() if line.startswith("  hint        ")]
    assert [h[14:] for h in hints] == feedback.padding_hints(c, HEAVY)


def test_a_run_logs_its_hints_once_after_its_third_step(tmp_path, monkeypatch, caplog):
    """The trainer's own loop: real steps, their lengths made heavy-tailed in the metrics rows (the tiny
    model rarely draws its end token early) so that the loop's wiring is what is tested."""
    real = Trainer.train_step

    def short_completions(self, state):
        state, m, samples = real(self, state)
        m.update({"response_length/mean": 10.0, "response_length/max": 32.0})
        return state, m, samples

    monkeypatch.setattr(Trainer, "train_step", short_completions)
    c = small_config(**{"total_steps": 4, "rollout.batch_prompts": 4, "rollout.group_size": 2,
                        "rollout.max_new_tokens": 32, "model.max_position_embeddings": 64,
                        "checkpoint.every_steps": 10, "log.samples_every": 0})
    out = io.StringIO()
    with caplog.at_level(logging.INFO, logger="jaxrl_llm.trainer.loop"), contextlib.redirect_stdout(out):
        history = Trainer(c, str(tmp_path / "run")).run()
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hint: ")]
    expected = feedback.padding_hints(c, history[:3])
    assert len(expected) == 2 and logged == [f"hint: {h}" for h in expected]  # once, from steps 1-3
    longest = int(history[0]["data/prompt_length_max"]) + 32  # the data's longest prompt + 32 new tokens
    assert expected[0].startswith("69% of the completion columns") and (  # 1 - 10/32
        f"train.pack_length={1 << (longest - 1).bit_length()} packs" in expected[0])
    assert sum(line.startswith("  hint        ") for line in out.getvalue().splitlines()) == 2
