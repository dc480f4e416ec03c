"""Evaluation on held-out prompts: pass@k, mean reward, maj@k and a per-level breakdown, during training
(`eval.every_steps`) and from the command line (`python -m jaxrl_llm.evaluate`, see __main__.py).

  pass_at_k(n, c, k)        the unbiased pass@k of n samples with c correct (estimators.py)
  majority_vote(answers, correct), summarize(...)
  Evaluator(config, model_config, mesh, tokenizer, reward_fns, eos_ids, pad_id, dataset)(params)
                            -> (metrics, samples) (evaluator.py)
  load_eval_data(config, tokenizer, held_out=None), eval_source(config), reward_config(config)

Metrics: `eval/pass@{1,2,4,...,k}`, `eval/mean_reward`, `eval/maj@{k}` (datasets with an answer
column), `eval/level{L}/{pass@1,pass@k,mean_reward,maj@k}` (the built-in task) and `eval/time_s`.
"""
from jaxrl_llm.evaluate.estimators import majority_vote, pass_at_k, pass_at_k_array, pass_ks, summarize
from jaxrl_llm.evaluate.evaluator import (EVAL_STREAM, Evaluator, eval_batch_prompts, eval_samples,
                                          eval_source, load_eval_data, reward_config, vote_key)

__all__ = ["EVAL_STREAM", "Evaluator", "eval_batch_prompts", "eval_samples", "eval_source", "load_eval_data", "majority_vote",
           "pass_at_k", "pass_at_k_array", "pass_ks", "reward_config", "summarize", "vote_key"]
