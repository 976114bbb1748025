"""Byte-level BPE tokenizers through tiktoken (GPT-2's, as in modded-nanogpt's FineWeb shards).

Which kind a dataset uses is deduced from data.tokenizer, so no extra config field can disagree with it:
``gpt2`` (tiktoken's named encoding) or a path ending in ``.tiktoken`` (a local GPT-2 vocabulary, e.g.
r50k_base.tiktoken, which holds the same 50,256 ranks as gpt2) is tiktoken; anything else is a SentencePiece
.model file.

Byte accounting is simpler than SentencePiece's (bpb.py): a byte-level BPE token decodes to exactly its byte
string, with no leading-space rule, so each ordinary token counts len(decode_single_token_bytes(id)) bytes and
a special token (<|endoftext|>, the document separator at the start of every document) counts 0 and is a
boundary. The sum over a document's tokens is then the UTF-8 length of the document (tests/data/test_tiktoken_bpb.py).

tiktoken is optional (the ``gpt2`` extra); it is imported only when a tiktoken tokenizer is asked for, and its
absence is reported before any work is done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from speedrun.data.bpb import ByteLUTs
from speedrun.errors import DataError

GPT2 = "gpt2"
"""data.tokenizer value naming tiktoken's GPT-2 encoding."""
GPT2_EOT_ID = 50256
"""<|endoftext|>: modded-nanogpt puts it at the start of every document; speedrun's BOS / document boundary."""
GPT2_VOCAB = 50257
TIKTOKEN_SUFFIX = ".tiktoken"
INSTALL_HINT = "pip install 'speedrun[gpt2]'"
ENDOFTEXT = "<|endoftext|>"


class DataNotFound(DataError, FileNotFoundError):
    """A .tiktoken file is missing."""


def is_tiktoken(spec: str | Path | None) -> bool:
    """Whether data.tokenizer ``spec`` names a tiktoken tokenizer (``gpt2`` or a ``*.tiktoken`` file)."""
    return spec is not None and (str(spec) == GPT2 or str(spec).endswith(TIKTOKEN_SUFFIX))


def require_tiktoken() -> Any:
    """The tiktoken module, or a DataError naming the extra that installs it."""
    try:
        import tiktoken
    except ImportError:
        raise DataError(f"a GPT-2 (tiktoken) tokenizer needs the tiktoken package: {INSTALL_HINT}") from None
    return tiktoken


def _offline_help() -> str:
    return (
        "tiktoken downloads the GPT-2 vocabulary on first use and caches it in TIKTOKEN_CACHE_DIR. Offline, "
        "either set TIKTOKEN_CACHE_DIR to a directory where tiktoken already cached it (run "
        "`python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\"` once on a machine with network and copy "
        "that directory), or download https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken "
        "(the same 50,257-token vocabulary) and set data.tokenizer=<path>/r50k_base.tiktoken"
    )


def load_encoding(spec: str | Path) -> Any:
    """tiktoken.Encoding for ``gpt2`` or a local ``*.tiktoken`` file (GPT-2's split pattern and <|endoftext|>
    after the last rank). DataError with the fix when tiktoken or the vocabulary is missing."""
    tiktoken = require_tiktoken()
    if str(spec) == GPT2:
        try:
            return tiktoken.get_encoding(GPT2)
        except Exception as e:  # network errors surface as requests/urllib/OSError subclasses
            raise DataError(
                f"cannot load tiktoken's gpt2 vocabulary ({type(e).__name__}: {e}).\n{_offline_help()}"
            ) from None
    path = Path(spec).expanduser()
    if not path.is_file():
        raise DataNotFound(f"tiktoken vocabulary not found: {path}.\n{_offline_help()}")
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    try:
        ranks = load_tiktoken_bpe(str(path))
    except Exception as e:
        raise DataError(f"{path}: not a .tiktoken vocabulary (lines '<base64 token> <rank>'): {e}") from None
    return tiktoken.Encoding(
        name=path.stem, pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={ENDOFTEXT: len(ranks)}
    )


def boundary_id(enc: Any) -> int:
    """The document separator: <|endoftext|> (50256 for GPT-2)."""
    return int(enc.encode_single_token(ENDOFTEXT))


def build_tiktoken_luts(enc: Any, vocab_size: int | None = None) -> ByteLUTs:
    """Byte tables for a byte-level BPE: ordinary tokens count their byte string's length, special tokens and
    ids without a token (gaps, or a padded vocabulary up to ``vocab_size``) count 0 and are boundaries."""
    size = max(int(enc.n_vocab), vocab_size or 0)
    base = np.zeros(size, dtype=np.int16)
    boundary = np.ones(size, dtype=np.bool_)
    special = {int(enc.encode_single_token(s)) for s in enc.special_tokens_set}
    for i in range(int(enc.n_vocab)):
        if i in special:
            continue
        try:
            piece = enc.decode_single_token_bytes(i)
        except KeyError:  # an unused rank
            continue
        base[i] = len(piece)
        boundary[i] = False
    lead = np.zeros(size, dtype=np.bool_)  # no leading-space rule: a space is an ordinary byte of its token
    return ByteLUTs(torch.from_numpy(base), torch.from_numpy(lead), torch.from_numpy(boundary))
