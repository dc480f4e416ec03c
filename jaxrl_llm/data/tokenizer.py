"""Tokenizers: the built-in character-level tokenizer and loading any Hugging Face tokenizer.

The built-in tokenizer lets the library run with no download: a fixed character vocabulary built in
memory with the `tokenizers` library and wrapped as a `transformers.PreTrainedTokenizerFast`, so the
rest of the library (and `save_hf`) treats it exactly like a tokenizer loaded from the hub.
"""

from __future__ import annotations

import os
import string

import tokenizers
from tokenizers import decoders, models
import transformers

from jaxrl_llm.data.files import check_tokenizer_path

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
# Last id, so that the documented layout (pad 0, eos 1, bos 2, then characters) stays fixed.
UNK_TOKEN = "<unk>"

# Ids 3.. in this order: digits first so that synthetic tasks see small, stable digit ids.
BUILTIN_ALPHABET = (
    string.digits + string.ascii_lowercase + string.ascii_uppercase + " \n" + string.punctuation
)


def builtin_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """The built-in character-level tokenizer (vocabulary of 100, no chat template).

    Ids: `<pad>` 0, `<eos>` 1, `<bos>` 2, then one id per character of `BUILTIN_ALPHABET` (digits,
    lower- and upper-case letters, space, newline, the 32 ASCII punctuation characters), then `<unk>`
    for any other character. Encoding adds no special token, so `encode(s)` has `len(s)` ids and
    `decode(encode(s)) == s` for every string over the alphabet (spaces included). Special-token text
    inside a string (a literal "<eos>") is encoded character by character, never as the special token.
    """
    symbols = [PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, *BUILTIN_ALPHABET, UNK_TOKEN]
    vocab = {symbol: i for i, symbol in enumerate(symbols)}
    # A BPE model with no merges and no pre-tokenizer maps every character to its own id; it keeps
    # spaces and newlines as ordinary symbols (a word-level model would split them away).
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    # Fuse joins the character tokens with no separator, so decode is the exact inverse.
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        # The default clean-up rewrites " ." to "." and would break the exact round trip.
        clean_up_tokenization_spaces=False,
        split_special_tokens=True,
        model_max_length=1 << 30,
    )


def load_tokenizer(path_or_name: str) -> transformers.PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained(path_or_name)`; the empty string gives `builtin_tokenizer()`.

    The tokenizer must define an EOS token (generation stops on it). Without a pad token the EOS token
    is used as pad: the library never relies on pad != eos, because every mask is explicit.
    """
    if not isinstance(path_or_name, str):
        raise ValueError(f"tokenizer path must be a string, got {type(path_or_name).__name__}")
    if path_or_name == "":
        return builtin_tokenizer()
    check_tokenizer_path(path_or_name)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.expanduser(path_or_name))
    except (OSError, ValueError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"could not load tokenizer {path_or_name!r}: {first_line}") from e
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"tokenizer {path_or_name!r} has no EOS token (eos_token is None); set eos_token in its "
            "tokenizer_config.json"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def has_chat_template(tokenizer: transformers.PreTrainedTokenizerBase) -> bool:
    """Whether `tokenizer` carries a chat template (`apply_chat_template` would work)."""
    return bool(getattr(tokenizer, "chat_template", None))
