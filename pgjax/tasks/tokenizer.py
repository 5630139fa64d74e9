"""Character-level tokenizers for the built-in tasks, built offline with ``tokenizers``.

Vocabulary: ``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2, then one id per
character of the alphabet in order (ids 3, 4, ...). No BOS token is added and
padding is on the left (what the sampler expects of prompts). A character
outside the alphabet encodes to ``<unk>``; the literal strings ``<pad>``,
``<eos>``, ``<unk>`` in a text encode to their special ids.

``tok.save_pretrained(dir)`` writes ``tokenizer.json`` and
``tokenizer_config.json`` beside a checkpoint; ``pgjax.models.hf.load_tokenizer(dir)``
reads them back with identical ids. Nothing is downloaded.
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


def char_tokenizer(alphabet: str):
    """A ``transformers.PreTrainedTokenizerFast`` with one token per character of ``alphabet``.

    Ids: ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2, ``alphabet[i]`` 3 + i. Encoding
    a text gives one id per character (no BOS/EOS added); decoding joins the
    characters back (``skip_special_tokens=True`` drops pad/eos).
    Raises ValueError for an empty alphabet or a repeated character.
    """
    from transformers import PreTrainedTokenizerFast  # heavy import, only when a tokenizer is built

    if not alphabet:
        raise ValueError("alphabet must be non-empty")
    repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if repeated:
        raise ValueError(f"alphabet repeats the character(s) {repeated}")
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *alphabet))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # every character is its own word
    backend.decoder = decoders.Fuse()  # join characters with no separator
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   padding_side="left", clean_up_tokenization_spaces=False)

