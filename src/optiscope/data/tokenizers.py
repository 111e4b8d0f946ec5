r"""Character- and word-level tokenizers with a vocabulary cap, an unknown token and frequency counts.

A tokenizer is a vocabulary: the tuple ``tokens``, where token id ``i`` stands for the string
``tokens[i]``. Decoding concatenates those strings, so ``decode(encode(text)) == text`` whenever every
piece of ``text`` is in the vocabulary.

Building from a text is deterministic. The text is split into pieces (characters, or the word pieces
defined below) and the pieces are ranked by count, most frequent first, ties broken by the pieces'
code-point order. Without ``max_vocab`` the vocabulary is every piece and there is no unknown token:
encoding a piece the text did not contain is an error. With ``max_vocab`` the unknown token(s) come
first and the most frequent pieces fill the remaining slots; any other piece encodes as unknown. So
ids follow frequency rank, and the rarest tokens have the largest ids.

Word pieces (``WordTokenizer``), matched left to right:

* a word — a run of letters, digits or underscores, possibly joined by apostrophes ``'`` or ``’``
  (``perform'd``, ``o'er``, ``men's``; a leading or trailing apostrophe is punctuation) — optionally
  preceded by one space: ``" love"`` and ``"love"`` are different tokens, as in GPT-2's vocabulary;
* one punctuation character, optionally preceded by one space (``","``, ``" ["``, ``"'"``);
* a run of whitespace, less the single space that belongs to the piece after it (``"\n"``, ``"\n\n"``).

``"Speak, Hamlet.\n"`` is ``["Speak", ",", " Hamlet", ".", "\n"]``. Keeping one leading space inside the
piece makes the split lossless without spending a token on every space. A word tokenizer with a cap
has two unknown tokens, ``"<unk>"`` and ``" <unk>"``, so an unknown word keeps its spacing:
``decode`` shows ``"the <unk>."`` for ``"the jester."`` when ``" jester"`` is out of the vocabulary.

Token counts (``counts``) give, per id, how often it occurs in an id sequence: the frequency axis of
the per-embedding-row analyses.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from contextlib import suppress
from typing import Any, ClassVar

import torch

UNK = "<unk>"
_WORD_PIECE = re.compile(r" ?\w+(?:['’]\w+)*| ?[^\w\s]|\s+?(?= \S)|\s+")


class Tokenizer(ABC):
    """A vocabulary over the pieces that ``split`` cuts a text into: token id i stands for ``tokens[i]``.

    The base of [`CharTokenizer`][optiscope.data.CharTokenizer] and
    [`WordTokenizer`][optiscope.data.WordTokenizer]; build one with ``from_text`` (ids by frequency rank,
    most frequent first) or ``from_dict``. ``decode(encode(text)) == text`` whenever every piece of ``text``
    is in the vocabulary.

    Args:
        tokens: the vocabulary, token id i standing for ``tokens[i]``: distinct non-empty strings. When it
            starts with the class's unknown token(s) (``"<unk>"``; for words also ``" <unk>"``), pieces out of
            the vocabulary encode as those.

    Attributes:
        tokens: the vocabulary as a tuple.
        ids: token → id.
        has_unknown: whether the vocabulary has the unknown token(s).

    Raises:
        ValueError: ``tokens`` empty, holding an empty string or a non-string, or repeating a token.

    Examples:
        >>> from optiscope.data import CharTokenizer, Tokenizer
        >>> tok = CharTokenizer.from_text("hello")
        >>> tok.tokens, tok.encode("hello")
        (('l', 'e', 'h', 'o'), [2, 1, 0, 0, 3])
        >>> Tokenizer.from_dict(tok.to_dict())
        CharTokenizer(vocab_size=4, unknown=False)

    Notes:
        Building from a text is deterministic: pieces are ranked by count, ties broken by code-point order.
        Without ``max_vocab`` the vocabulary is every piece and there is no unknown token: encoding a piece
        the text did not contain is an error. With ``max_vocab`` the unknown token(s) come first and the most
        frequent pieces fill the remaining slots; any other piece encodes as unknown. So the rarest tokens
        have the largest ids. ``counts`` gives the frequency axis of the per-embedding-row analyses.
    """

    kind: ClassVar[str]
    unknown_tokens: ClassVar[tuple[str, ...]]

    def __init__(self, tokens: Sequence[str]):
        tokens = tuple(tokens)
        if not tokens or not all(isinstance(t, str) and t for t in tokens):
            raise ValueError(f"{type(self).__name__}: tokens must be non-empty strings, got {list(tokens)[:5]}")
        if len(set(tokens)) != len(tokens):
            repeated = sorted(t for t, n in Counter(tokens).items() if n > 1)
            raise ValueError(f"{type(self).__name__}: repeated tokens {repeated[:5]}")
        self.tokens = tokens
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.has_unknown = tokens[: len(self.unknown_tokens)] == self.unknown_tokens

    @staticmethod
    @abstractmethod
    def split(text: str) -> list[str]:
        """The pieces of ``text``; their concatenation is ``text``.

        Args:
            text: the text to cut.

        Returns:
            The pieces, in order.
        """

    @staticmethod
    @abstractmethod
    def unknown_for(piece: str) -> str:
        """The unknown token that stands for ``piece`` when it is out of the vocabulary.

        Args:
            piece: a piece that ``split`` cut.

        Returns:
            One of the class's unknown tokens.
        """

    @classmethod
    def from_text(cls, text: str, max_vocab: int | None = None) -> Tokenizer:
        """The vocabulary of ``text``, ids by frequency rank (ties in count go to the smaller code points).

        Args:
            text: the text whose pieces to count; not empty.
            max_vocab: the vocabulary's size: the k unknown tokens plus the ``max_vocab − k`` most frequent
                pieces; an integer > k. None for every piece, with no unknown token.

        Returns:
            A tokenizer of the class it is called on.

        Raises:
            ValueError: an empty ``text``, or ``max_vocab`` not an integer > k.
        """
        counts = Counter(cls.split(text))
        if not counts:
            raise ValueError(f"{cls.__name__}.from_text: the text is empty")
        ranked = sorted(counts, key=lambda piece: (-counts[piece], piece))
        if max_vocab is None:
            return cls(ranked)
        k = len(cls.unknown_tokens)
        if not isinstance(max_vocab, int) or isinstance(max_vocab, bool) or max_vocab <= k:
            raise ValueError(
                f"{cls.__name__}.from_text: max_vocab={max_vocab!r} must be an integer > {k} "
                f"(the {k} unknown token(s) plus at least one piece), or None for no cap"
            )
        return cls(cls.unknown_tokens + tuple(ranked[: max_vocab - k]))

    @property
    def vocab_size(self) -> int:
        """V, the number of tokens (the model's ``vocab_size``)."""
        return len(self.tokens)

    @property
    def unknown_ids(self) -> tuple[int, ...]:
        """Ids of the unknown token(s); empty for a vocabulary built without a cap."""
        return tuple(range(len(self.unknown_tokens))) if self.has_unknown else ()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``.

        Args:
            text: the text to encode.

        Returns:
            One id per piece; an out-of-vocabulary piece gets the unknown token's.

        Raises:
            ValueError: a piece out of the vocabulary when it has no unknown token (the message names the
                piece and its character offset).
        """
        pieces = self.split(text)
        with suppress(KeyError):  # some piece is out of the vocabulary: the slower loop below handles it
            return [self.ids[piece] for piece in pieces]
        ids, offset = [], 0
        for piece in pieces:
            i = self.ids.get(piece)
            if i is None:
                if not self.has_unknown:
                    raise ValueError(
                        f"{type(self).__name__}.encode: {piece!r} at character {offset} is not among the "
                        f"{self.vocab_size} tokens, and a vocabulary built without max_vocab has no unknown token"
                    )
                i = self.ids[self.unknown_for(piece)]
            ids.append(i)
            offset += len(piece)
        return ids

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """The text of token ids: their strings concatenated (an unknown token decodes as ``<unk>``).

        Args:
            ids: token ids, a sequence or a tensor.

        Returns:
            The text.

        Raises:
            ValueError: an id outside 0 … V − 1.
        """
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = [i for i in ids if not (isinstance(i, int) and 0 <= i < self.vocab_size)]
        if bad:
            raise ValueError(f"{type(self).__name__}.decode: id {bad[0]!r} is not in 0..{self.vocab_size - 1}")
        return "".join(self.tokens[i] for i in ids)

    def counts(self, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """How often each token id occurs in ``ids``.

        Args:
            ids: token ids, a sequence or a tensor of any shape.

        Returns:
            An int64 tensor of length ``vocab_size``.

        Raises:
            ValueError: an id outside 0 … V − 1.
        """
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise ValueError(f"{type(self).__name__}.counts: id {bad} is not in 0..{self.vocab_size - 1}")
        return torch.bincount(ids, minlength=self.vocab_size)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (for checkpoints and ``results.json``); ``Tokenizer.from_dict`` reverses it.

        Returns:
            ``{"kind": "char" or "word", "tokens": [...]}``.
        """
        return {"kind": self.kind, "tokens": list(self.tokens)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Tokenizer:
        """The tokenizer ``to_dict`` described; called on ``Tokenizer`` it picks the class by ``kind``.

        Args:
            state: what ``to_dict`` returned.

        Returns:
            The tokenizer, of the class ``kind`` names.

        Raises:
            ValueError: an unknown ``kind``, one of another class than the one called on, or bad ``tokens``.
        """
        kind = state.get("kind") if isinstance(state, dict) else None
        if kind not in TOKENIZERS or (cls is not Tokenizer and TOKENIZERS[kind] is not cls):
            expected = sorted(TOKENIZERS) if cls is Tokenizer else [cls.kind]
            raise ValueError(f"{cls.__name__}.from_dict: kind {kind!r}; expected one of {expected}")
        return TOKENIZERS[kind](state["tokens"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, unknown={self.has_unknown})"


class CharTokenizer(Tokenizer):
    """A character-level tokenizer: one token per Unicode character.

    A vocabulary built with ``max_vocab`` has the single unknown token ``"<unk>"`` (id 0), which every
    character out of the vocabulary encodes as.

    Args:
        tokens: the vocabulary, token id i standing for ``tokens[i]``: distinct non-empty strings, starting
            with ``"<unk>"`` for a vocabulary with an unknown token. Usually built by ``from_text``.

    Examples:
        >>> from optiscope.data import CharTokenizer
        >>> tok = CharTokenizer.from_text("hello", max_vocab=3)  # <unk>, then the two most frequent
        >>> tok.tokens, tok.encode("hello")
        (('<unk>', 'l', 'e'), [0, 2, 1, 1, 0])
        >>> tok.decode(tok.encode("hello")), tok.counts(tok.encode("hello")).tolist()
        ('<unk>ell<unk>', [2, 2, 1])
    """

    kind = "char"
    unknown_tokens = (UNK,)

    @staticmethod
    def split(text: str) -> list[str]:
        return list(text)

    @staticmethod
    def unknown_for(piece: str) -> str:
        return UNK


class WordTokenizer(Tokenizer):
    r"""A word-level tokenizer: words and punctuation with their leading space, and whitespace runs.

    Pieces, matched left to right: a word (a run of letters, digits or underscores, possibly joined by
    apostrophes ``'`` or ``’``: ``perform'd``, ``o'er``, ``men's``), or one punctuation character, either
    optionally preceded by one space (``" love"`` and ``"love"`` are different tokens, as in GPT-2's
    vocabulary); or a run of whitespace, less the single space that belongs to the piece after it.

    Args:
        tokens: the vocabulary, token id i standing for ``tokens[i]``: distinct non-empty strings, starting
            with ``"<unk>"`` and ``" <unk>"`` for a vocabulary with unknown tokens. Usually built by
            ``from_text``.

    Examples:
        >>> from optiscope.data import WordTokenizer
        >>> WordTokenizer.split("Speak, Hamlet.\n")
        ['Speak', ',', ' Hamlet', '.', '\n']
        >>> tok = WordTokenizer.from_text("to be or not to be", max_vocab=4)
        >>> tok.tokens
        ('<unk>', ' <unk>', ' be', ' not')
        >>> tok.decode(tok.encode("to be or not"))  # an unknown word keeps its spacing
        '<unk> be <unk> not'

    Notes:
        A leading or trailing apostrophe is punctuation. Keeping one leading space inside the piece makes the
        split lossless without spending a token on every space. A capped vocabulary has two unknown tokens,
        ``"<unk>"`` and ``" <unk>"``, so an unknown word keeps its spacing: ``decode`` shows ``"the <unk>."``
        for ``"the jester."`` when ``" jester"`` is out of the vocabulary.
    """

    kind = "word"
    unknown_tokens = (UNK, " " + UNK)

    @staticmethod
    def split(text: str) -> list[str]:
        return _WORD_PIECE.findall(text)

    @staticmethod
    def unknown_for(piece: str) -> str:
        return " " + UNK if piece.startswith(" ") and len(piece) > 1 and not piece[1].isspace() else UNK


TOKENIZERS: dict[str, type[Tokenizer]] = {"char": CharTokenizer, "word": WordTokenizer}
