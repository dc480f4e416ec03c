"""Tiny tokenizers with the chat templates of real tool-calling models, for tests/test_envs*.py.

`qwen_tokenizer()`: ChatML turns and Qwen2.5's tool template (tools listed in the system turn, calls in
<tool_call> tags, consecutive tool results grouped in one user turn of <tool_response> blocks).
`llama3_tokenizer()`: Llama 3 headers, <|eot_id|> turn ends and the `ipython` role for tool results.
Both are byte-level BPE vocabularies built with `tokenizers` (a few merges), no download.
"""
from __future__ import annotations

import tokenizers
from tokenizers import decoders, models, pre_tokenizers
import transformers

QWEN_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are helpful.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions.\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object within <tool_call></tool_call> tags.<|im_end|>\\n' }}"
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\nTools:\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}{{- '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- set role = 'ipython' if message.role == 'tool' else message.role %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("o", "o"), ("l", "s"), ('"', ":")]


def _byte_bpe(specials, template, **kwargs) -> transformers.PreTrainedTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    for left, right in _MERGES:
        vocab[left + right] = len(vocab)
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=list(_MERGES)))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(specials))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False,
                                               **kwargs)
    tok.chat_template = template
    return tok


def qwen_tokenizer() -> transformers.PreTrainedTokenizerFast:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return _byte_bpe(specials, QWEN_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                     additional_special_tokens=specials[1:])


def llama3_tokenizer() -> transformers.PreTrainedTokenizerFast:
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|eom_id|>", "<|python_tag|>"]
    return _byte_bpe(specials, LLAMA3_TEMPLATE, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                     additional_special_tokens=specials[2:])


def word_count(text: str) -> int:
    """Counts the words of a text (a tool importable as 'fixtures_envs:word_count').

    Args:
        text: The text.
    """
    return len(text.split())
