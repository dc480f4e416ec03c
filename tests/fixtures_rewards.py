"""Reward functions for tests, referenced by import path (`fixtures_rewards:digit_fraction`)."""


def digit_fraction(prompts, completions, **_):
    """Fraction of digit characters: varies between samples of a group from the first step on."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def char_code(prompts, completions, **_):
    """The completion's character codes summed, mod 10, in [0, 1]: two different completions of a group
    almost always score differently, so every group has a learning signal (digit_fraction scores 0 for
    every completion of a random model with a byte-level tokenizer that rarely samples a digit)."""
    return [(sum(map(ord, c)) % 10) / 9 for c in completions]


def raises_on_x(prompts, completions, **_):
    if any("x" in c for c in completions):
        raise RuntimeError("found an x")
    return [0.0] * len(completions)


def nan_reward(prompts, completions, **_):
    return [float("nan")] * len(completions)


def wrong_length(prompts, completions, **_):
    return [0.0] * (len(completions) + 1)


def always_zero(prompts, completions, **_):
    """An accuracy reward that no completion earns: every group is all wrong."""
    return [0.0] * len(completions)


def digit_steps(prompts, completions, completion_lengths, **_):
    """A process reward: a step at every token, +1 for a digit, -1 otherwise (character tokenizer:
    token t is character t; the EOS, when there is one, is the last token and closes no step)."""
    return [[(t, 1.0 if ch.isdigit() else -1.0) for t, ch in enumerate(c[:n])] for c, n in zip(completions,
                                                                                           completion_lengths)]
