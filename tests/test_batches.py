"""Samples in a batch, as the DataLoader hook counts them
(hooks._batch_size), on the batch types real pipelines yield: made by the
libraries' own collators and loaders here, never imitated.

Where the count is 0 the report has no samples/s at all, so each of these
was a run without throughput: Hugging Face's tokenizer-backed collators
return a BatchEncoding (a mapping, not a dict), and PyG's DataLoader a
Batch whose tensors count nodes.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest
import torch
from torch.utils.data import DataLoader

from perfrun.runtime.hooks import _batch_size


def word_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "the cat sat on a mat and dog ran".split()
    vocab = {"[PAD]": 0, "[UNK]": 1, "[MASK]": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   mask_token="[MASK]")


TEXTS = ["the cat sat on a mat", "a dog ran", "the dog sat", "cat and dog"] * 5


def test_a_padding_collators_batch_encoding_counts_its_rows() -> None:
    from transformers import BatchEncoding, DataCollatorWithPadding

    tokenizer = word_tokenizer()
    features = [dict(tokenizer(t), label=i % 2) for i, t in enumerate(TEXTS)]
    loader = DataLoader(features, batch_size=8, collate_fn=DataCollatorWithPadding(tokenizer))
    batches = list(loader)
    assert all(isinstance(b, BatchEncoding) and not isinstance(b, dict) for b in batches)
    assert [_batch_size(b) for b in batches] == [8, 8, 4]


def test_a_language_modelling_collators_batch_counts_its_rows() -> None:
    from transformers import DataCollatorForLanguageModeling

    tokenizer = word_tokenizer()
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15)
    batch = collator([tokenizer(t) for t in TEXTS[:6]])
    assert batch["input_ids"].shape[0] == 6
    assert _batch_size(batch) == 6


# PyG's import scripts a few functions with torch.jit, which torch 2.13 warns of.
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_pyg_batch_counts_graphs_not_nodes() -> None:
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader as GraphLoader

    g = torch.Generator().manual_seed(0)
    graphs = [Data(x=torch.randn(n, 4, generator=g),
                   edge_index=torch.randint(0, n, (2, 2 * n), generator=g))
              for n in range(10, 30)]
    batches = list(GraphLoader(graphs, batch_size=8))
    assert [b.num_graphs for b in batches] == [8, 8, 4]
    assert batches[0].x.shape[0] == sum(range(10, 18))  # nodes
    assert [_batch_size(b) for b in batches] == [8, 8, 4]


def test_dataclass_and_named_tuple_batches_count_their_first_tensor() -> None:
    @dataclasses.dataclass
    class Batch:
        ids: list[str]
        images: torch.Tensor
        labels: torch.Tensor

    class Pair(NamedTuple):
        images: torch.Tensor
        labels: torch.Tensor

    assert _batch_size(Batch(["a", "b", "c"], torch.zeros(3, 1, 4, 4), torch.zeros(3))) == 3
    assert _batch_size(Pair(torch.zeros(5, 2), torch.zeros(5))) == 5
    # A class is not a batch, nor a flag a batch size.
    assert _batch_size(Batch) == 0
    assert _batch_size({"batch_size": True, "x": torch.zeros(2)}) == 2
