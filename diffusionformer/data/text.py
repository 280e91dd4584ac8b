"""Character-level corpora for causal language modelling.

* ``"pydoc-chars"``: the Python language reference topics that ship with CPython
  (``pydoc_data.topics.topics``, values joined in sorted key order, ~465k characters);
  split 90/10 train/val like nanoGPT's ``shakespeare_char``.
* ``"tinyshakespeare"``: ``<root>/tinyshakespeare/input.txt`` (Karpathy's char-rnn corpus,
  1,115,394 characters, 65 symbols); first 90% train, last 10% val, exactly as nanoGPT.
  Its SHA256 is checked; a mismatch raises :class:`~diffusionformer.data.paths.ChecksumError`.

The vocabulary is the sorted set of characters of the whole corpus (as nanoGPT).
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import torch

from .base import TextData
from .checksums import _check_size, _check_unchanged, verify_file
from .paths import CorruptDataError, require_files
from .registry import register_dataset

__all__ = ["char_text_data", "read_text", "load_pydoc_chars", "load_tinyshakespeare"]

TINYSHAKESPEARE = "tinyshakespeare/input.txt"
# bytes of the corpus file, hashed and read whole: far above tinyshakespeare's 1.1 MB, far below what a sparse file of a
# terabyte would take to hash (minutes) or fill memory with
_MAX_CORPUS_BYTES = 2**30


def char_text_data(
    name: str, text: str, *, train_fraction: float = 0.9, meta: dict[str, Any] | None = None
) -> TextData:
    r"""Tokenise ``text`` by character and split it into a leading train and trailing val part.

    ``itos = sorted(set(text))``; token ids ``s_t = stoi[text[t]]``; train is
    ``s[: floor(f L)]`` and val the rest.

    Args:
        name: dataset name.
        text: the corpus.
        train_fraction: share ``f`` of the characters in train, in ``(0, 1)``.
        meta: extra notes (source, licence); sizes are added.

    Examples:
        >>> data = char_text_data("toy", "abcabcabca")
        >>> data.itos, data.train.tolist(), data.val.tolist()
        (['a', 'b', 'c'], [0, 1, 2, 0, 1, 2, 0, 1, 2], [0])
    """
    if not isinstance(text, str):  # bytes would become integer "characters", a list whole-word tokens
        hint = " (decode it first, e.g. text.decode('utf-8'))" if isinstance(text, (bytes, bytearray)) else ""
        raise TypeError(f"text must be a str, got {type(text).__name__}{hint}")
    if isinstance(train_fraction, bool) or not isinstance(train_fraction, numbers.Real):  # "0.5": a bare '<' error
        raise ValueError(f"train_fraction must be in (0, 1) (a number), got {train_fraction!r}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    if len(text) < 2:
        raise ValueError(f"text must have at least 2 characters, got {len(text)}")
    itos = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(itos)}
    ids = torch.tensor([stoi[ch] for ch in text], dtype=torch.int64)
    n = int(train_fraction * len(ids))
    if n == 0:  # (the val split is never empty: floor(f L) < L for f < 1)
        raise ValueError(
            f"train_fraction={train_fraction} of {len(ids)} characters leaves the train split "
            "empty; give a longer text or a larger train_fraction"
        )
    meta = dict(meta or {})
    meta.update(
        characters=len(text),
        sizes={"train": n, "val": len(ids) - n},
        split=f"first {float(train_fraction):.0%} train, rest val",  # a Fraction: no "%" before 3.12
    )
    return TextData(
        name=name, train=ids[:n], val=ids[n:], vocab_size=len(itos), itos=itos, meta=meta
    )


def read_text(path: Path) -> str:
    """Read a UTF-8 text file; undecodable bytes raise :class:`CorruptDataError` naming the file."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CorruptDataError(
            f"corrupt text file {str(path)!r}: not valid UTF-8 ({err})"
        ) from None


@register_dataset("pydoc-chars", kind="text")
def load_pydoc_chars(*, seed: int = 0, train_fraction: float = 0.9) -> TextData:
    """The Python reference topics from ``pydoc_data.topics`` as a character corpus.

    Args:
        seed: unused (the split is contiguous); accepted for a uniform interface.
        train_fraction: share of the characters in train.

    Shapes:
        - train, val: ``(L,)`` int64
    """
    from pydoc_data.topics import topics

    text = "".join(topics[key] for key in sorted(topics))
    return char_text_data(
        "pydoc-chars",
        text,
        train_fraction=train_fraction,
        meta={
            "source": "pydoc_data.topics.topics (Python standard library), sorted keys",
            "licence": "Python documentation, PSF licence",
        },
    )


@register_dataset("tinyshakespeare", kind="text", needs_root=True)
def load_tinyshakespeare(
    *, root: Path | None, seed: int = 0, train_fraction: float = 0.9, verify: bool = True,
    train_chars: int | None = None,
) -> TextData:
    """Tiny Shakespeare (char-rnn / nanoGPT ``shakespeare_char``) from the data root.

    Args:
        root: data root holding ``tinyshakespeare/input.txt``.
        seed: unused (the split is contiguous); accepted for a uniform interface.
        train_fraction: share of the characters in train (nanoGPT: 0.9).
        verify: check the file's SHA256 against the staged one.
        train_chars: keep only the first ``train_chars`` characters of the train split (a
            small training set that a model over-fits); the val split and the vocabulary
            stay those of the full corpus. ``None`` keeps all.

    Raises:
        CorruptDataError: a file that is not UTF-8 or holds fewer than 2 characters, changed while it was read, or
            over 1 GiB (refused unread and unhashed); ``ChecksumError`` (with ``verify``): another file.

    Shapes:
        - train, val: ``(L,)`` int64; the staged file gives 1,003,854 / 111,540 tokens, vocab 65.
    """
    if train_chars is not None and (isinstance(train_chars, bool) or not isinstance(train_chars, numbers.Integral)
                                    or train_chars < 2):
        raise ValueError(f"train_chars must be an int >= 2 or None, got {train_chars!r}")
    train_chars = None if train_chars is None else int(train_chars)
    (path,) = require_files("tinyshakespeare", root, [TINYSHAKESPEARE])
    _check_size(path, _MAX_CORPUS_BYTES, "a character corpus this loader reads (tinyshakespeare: 1,115,394 B)")
    digest = verify_file(path, TINYSHAKESPEARE) if verify else ""
    text = read_text(path)
    if verify:  # the file rewritten after its hash: the text read was never checked
        _check_unchanged(path, digest)
    if len(text) < 2:  # (verify=False): char_text_data would refuse it without naming the file
        raise CorruptDataError(f"tinyshakespeare: {str(path)!r} holds {len(text)} character(s), expected a corpus")
    data = char_text_data(
        "tinyshakespeare",
        text,
        train_fraction=train_fraction,
        meta={
            "source": "karpathy/char-rnn data/tinyshakespeare/input.txt",
            "licence": "Shakespeare's plays, public domain",
            "path": str(path),
        },
    )
    if train_chars is None:
        return data
    if train_chars > data.train.numel():
        raise ValueError(f"train_chars must be at most the {data.train.numel()} train characters, got {train_chars}")
    data.train = data.train[:train_chars].clone()
    data.meta["sizes"] = {"train": train_chars, "val": data.val.numel()}
    data.meta["split"] += f"; train cut to its first {train_chars} characters"
    return data
