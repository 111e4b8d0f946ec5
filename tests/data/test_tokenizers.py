"""Tokenizers: hand-worked vocabularies and splits, lossless round trips, unknown tokens, counts against
collections.Counter, and save/load through JSON."""

import json
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optiscope.data.tokenizers import TOKENIZERS, UNK, CharTokenizer, Tokenizer, WordTokenizer
from support import HYPOTHESIS_SETTINGS


def test_char_vocabulary_is_ranked_by_count_then_code_point():
    # abracadabra: a×5, b×2, r×2, c×1, d×1 — ties b/r and c/d go to the smaller code point
    tok = CharTokenizer.from_text("abracadabra")
    assert tok.tokens == ("a", "b", "r", "c", "d") and tok.vocab_size == 5 and tok.unknown_ids == ()
    assert tok.encode("cab") == [3, 0, 1]
    assert CharTokenizer.from_text("ba").tokens == CharTokenizer.from_text("ab").tokens == ("a", "b")


def test_char_cap_keeps_the_most_frequent_and_maps_the_rest_to_unknown():
    tok = CharTokenizer.from_text("abracadabra", max_vocab=3)
    assert tok.tokens == (UNK, "a", "b") and tok.unknown_ids == (0,)
    assert tok.encode("abrz") == [1, 2, 0, 0]
    assert tok.decode(tok.encode("abrz")) == f"ab{UNK}{UNK}"


def test_encoding_an_unseen_piece_without_unknown_token_names_it():
    with pytest.raises(ValueError, match=r"'z' at character 3 is not among the 5 tokens"):
        CharTokenizer.from_text("abracadabra").encode("abrz")
    with pytest.raises(ValueError, match=r"' Horatio' at character 7 is not among"):
        WordTokenizer.from_text("Hamlet, Ophelia").encode("Hamlet, Horatio")


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("Speak, Hamlet.\n", ["Speak", ",", " Hamlet", ".", "\n"]),
        ("I'll perform'd o'er 'tis men's", ["I'll", " perform'd", " o'er", " '", "tis", " men's"]),
        ("punish’d  twice\n\n  [Exit.]", ["punish’d", " ", " twice", "\n\n ", " [", "Exit", ".", "]"]),
        ("end \n--x2_y 3", ["end", " \n", "-", "-", "x2_y", " 3"]),
        ("", []),
    ],
)
def test_word_split_examples(text, pieces):
    assert WordTokenizer.split(text) == pieces


@settings(**HYPOTHESIS_SETTINGS)
@given(st.text(alphabet=st.sampled_from(list("ab '’.,\n\t-é")), max_size=40))
def test_pieces_concatenate_to_the_text(text):
    for cls in (CharTokenizer, WordTokenizer):
        assert "".join(cls.split(text)) == text
        if text:
            tok = cls.from_text(text)
            assert tok.decode(tok.encode(text)) == text


def test_word_unknown_tokens_keep_the_spacing():
    tok = WordTokenizer.from_text("the king, the queen.\nthe king", max_vocab=8)
    # pieces: "the" ×2, " king" ×2, then once each (code-point order): "\n", " queen", " the", ",", "."
    assert tok.tokens == (UNK, " " + UNK, " king", "the", "\n", " queen", " the", ",")
    assert tok.unknown_ids == (0, 1)
    assert tok.encode("the jester.\nThe king") == [3, 1, 0, 4, 0, 2]
    assert tok.decode(tok.encode("the jester.\nThe king")) == "the <unk><unk>\n<unk> king"


def test_max_vocab_is_validated():
    for bad in (0, 1, 2, -5, 2.5, True, "8"):
        with pytest.raises(ValueError, match=r"max_vocab=.* must be an integer > 2"):
            WordTokenizer.from_text("a b c", max_vocab=bad)
    with pytest.raises(ValueError, match=r"max_vocab=1 must be an integer > 1"):
        CharTokenizer.from_text("abc", max_vocab=1)
    with pytest.raises(ValueError, match="the text is empty"):
        CharTokenizer.from_text("")


def test_counts_match_counter_and_reject_bad_ids():
    text = "to be, or not to be: that is the question"
    tok = WordTokenizer.from_text(text)
    ids = tok.encode(text)
    counts = tok.counts(ids)
    assert counts.dtype == torch.int64 and counts.shape == (tok.vocab_size,)
    expected = Counter(WordTokenizer.split(text))
    assert {tok.tokens[i]: int(n) for i, n in enumerate(counts)} == expected
    assert torch.equal(tok.counts(torch.tensor(ids)), counts)
    assert int(tok.counts([]).sum()) == 0
    with pytest.raises(ValueError, match=rf"id {tok.vocab_size} is not in 0..{tok.vocab_size - 1}"):
        tok.counts([0, tok.vocab_size])
    with pytest.raises(ValueError, match=r"id -1 is not in"):
        tok.counts([-1])


def test_decode_rejects_ids_outside_the_vocabulary():
    tok = CharTokenizer.from_text("abc")
    assert tok.decode(torch.tensor([2, 1, 0])) == "cba"
    for bad in ([3], [-1], [0.5]):
        with pytest.raises(ValueError, match=r"decode: id .* is not in 0\.\.2"):
            tok.decode(bad)


@pytest.mark.parametrize("cls", [CharTokenizer, WordTokenizer])
def test_to_dict_round_trips_through_json(cls):
    text = "Now is the winter of our discontent\nMade glorious summer"
    tok = cls.from_text(text, max_vocab=12)
    state = json.loads(json.dumps(tok.to_dict()))
    assert state["kind"] == cls.kind
    for back in (cls.from_dict(state), Tokenizer.from_dict(state), TOKENIZERS[cls.kind].from_dict(state)):
        assert type(back) is cls and back.tokens == tok.tokens and back.unknown_ids == tok.unknown_ids
        assert back.encode(text + " York") == tok.encode(text + " York")


def test_from_dict_rejects_other_kinds_and_bad_vocabularies():
    state = WordTokenizer.from_text("a b").to_dict()
    with pytest.raises(ValueError, match=r"CharTokenizer.from_dict: kind 'word'; expected one of \['char'\]"):
        CharTokenizer.from_dict(state)
    with pytest.raises(ValueError, match=r"kind 'bpe'; expected one of \['char', 'word'\]"):
        Tokenizer.from_dict({"kind": "bpe", "tokens": ["a"]})
    with pytest.raises(ValueError, match=r"repeated tokens \['a'\]"):
        CharTokenizer(["a", "b", "a"])
    with pytest.raises(ValueError, match="non-empty strings"):
        CharTokenizer(["a", ""])
