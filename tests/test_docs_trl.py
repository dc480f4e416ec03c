"""docs/coming_from_trl.md cannot rot: every field of ours its tables name exists in base_config, and every
value it gives one is accepted by the config's validation."""
import ast
import os
import re

import pytest

from jaxrl_llm import config as config_lib
from jaxrl_llm.validation import get_path

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "coming_from_trl.md")


def cited_fields() -> list[tuple[str, str, str | None]]:
    """(table row, field, value or None) for each `field` or `field=value` in the "ours" column."""
    out, column = [], None
    for line in open(DOC, encoding="utf-8"):
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            column = cells.index("ours")  # the header row of a table
            continue
        if set(cells[0]) <= set("-: "):
            continue
        for span in re.findall(r"`([^`]+)`", cells[column]):
            field, _, value = span.partition("=")
            out.append((cells[0], field, value or None))
    return out


def test_the_doc_cites_fields():
    fields = {f for _, f, _ in cited_fields()}
    assert {"rollout.group_size", "kl.coef", "loss.clip_high", "loss.aggregate", "train.epochs"} <= fields
    assert len(cited_fields()) > 60


@pytest.mark.parametrize("row,field,value", cited_fields())
def test_each_cited_field_exists_and_its_value_validates(row, field, value):
    base = config_lib.base_config()
    try:
        get_path(base, field)
    except (KeyError, AttributeError):
        pytest.fail(f"docs/coming_from_trl.md row {row!r} names {field!r}, which is not a field of base_config()")
    if value is not None:
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        config_lib.prepare(config_lib.from_dict({"data.task": "digit_puzzles", field: parsed}))


# Every field TRL's GRPOConfig declares (and the TrainingArguments defaults its base config overrides).
TRL_GRPO_FIELDS = """
    learning_rate model_init_kwargs trust_remote_code router_aux_loss_coef disable_dropout cast_lm_head_to_fp32
    remove_unused_columns num_generations num_generations_eval max_completion_length ds3_gather_for_generation
    shuffle_dataset pad_to_multiple_of generation_batch_size steps_per_generation temperature top_p top_k min_p
    generation_kwargs chat_template_kwargs repetition_penalty cache_implementation use_vllm vllm_mode
    vllm_model_impl vllm_enable_sleep_mode vllm_structured_outputs_regex vllm_server_base_url vllm_server_host
    vllm_server_port vllm_server_timeout vllm_group_port vllm_gpu_memory_utilization vllm_max_model_length
    vllm_tensor_parallel_size beta num_iterations epsilon delta epsilon_high sapo_temperature_neg
    sapo_temperature_pos vespo_k_pos vespo_lambda_pos vespo_k_neg vespo_lambda_neg importance_sampling_level
    reward_weights multi_objective_aggregation scale_rewards loss_type mask_truncated_completions sync_ref_model
    ref_model_mixup_alpha ref_model_sync_steps top_entropy_quantile entropy_coef use_adaptive_entropy
    entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target max_tool_calling_iterations
    vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_importance_sampling_clip_max
    vllm_importance_sampling_clip_min off_policy_mask_threshold use_bias_correction_kl log_completions
    log_multimodal num_completions_to_print log_unique_prompts log_completions_hub_repo
    use_transformers_continuous_batching transformers_continuous_batching_config use_transformers_paged
    vllm_importance_sampling_cap logging_steps gradient_checkpointing bf16 lr_scheduler_kwargs use_liger_kernel
    torch_empty_cache_steps
""".split()


def trl_column() -> set[str]:
    """The TRL names of the TRL table's first column: each `name` or `name=value` span."""
    doc = open(DOC, encoding="utf-8").read()
    section = doc[doc.index("## TRL:"):doc.index("## Tunix")]
    out = set()
    for line in section.splitlines():
        if line.startswith("|"):
            first = line.strip().strip("|").split("|")[0]
            out.update(span.split("=")[0].split(" ")[0] for span in re.findall(r"`([^`]+)`", first))
    return out


def test_every_grpo_config_field_is_in_the_table():
    assert len(TRL_GRPO_FIELDS) == 85
    missing = [f for f in TRL_GRPO_FIELDS if f not in trl_column()]
    assert not missing, f"docs/coming_from_trl.md does not list the GRPOConfig fields {missing}"
