"""What multi-turn logs show: the prompt the episode's reset() returned (not the dataset column), and
per-turn reward means only for the turns some episode reached."""
import json

from jaxrl_llm.envs import Environment, StepResult
from jaxrl_llm.trainer import Trainer

from test_trainer_multiturn import mt_config


class OneTurn(Environment):
    """Rewrites the prompt and ends every episode after its first turn, rewarding a digit."""

    def reset(self, row):
        return "say:" + str(row["prompt"]), None

    def step(self, state, turn_text):
        return StepResult(None, float(turn_text.isdigit()), state)


def test_samples_show_the_reset_prompt_and_only_reached_turns_are_logged(tmp_path):
    c = mt_config(**{"env.name": "test_env_logging:OneTurn", "total_steps": 1, "data.max_prompt_length": 12})
    (m,) = Trainer(c, str(tmp_path)).run()
    assert m["env/turns/mean"] == 1.0 and c.env.max_turns == 4
    assert "env/reward/turn1/mean" in m and not any(f"env/reward/turn{k}/mean" in m for k in (2, 3, 4))
    logged = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert logged and all(s["prompt"] == "say:guess:" for s in logged)
