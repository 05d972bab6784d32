"""Gradient accumulation: a loss normalized per micro-batch instead of per token.

A language-model loss over a batch of sequences with padding (label -100 = ignored): the
full-batch loss is the mean over *all valid tokens*. Split into micro-batches, the common bug
(fixed in Hugging Face transformers in 2024) takes each micro-batch's own token mean and
averages those: micro-batches with fewer valid tokens weigh more, and the accumulated loss
differs from the full-batch one -- by much more than round-off, but by a small enough amount
that it looks like "numerical noise" in a plot.

fpx classifies:
* ``per_microbatch_mean`` (the bug) against the full-batch loss: BUG;
* ``per_token_sum`` (each micro-batch's summed token losses, divided by the total token
  count at the end: the correct normalization, summed in another order): ROUND-OFF.
Run: ``python examples/torch_grad_accumulation.py``.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import fpx

IGNORE = -100


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 32, d: int = 16, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.out(torch.tanh(self.mix(self.emb(ids))))


def full_batch_loss(logits, labels):
    """Mean over every valid token of the whole batch (the reference)."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


def per_microbatch_mean(logits, labels, micro: int = 2):
    """The bug: each micro-batch's token mean, averaged over micro-batches."""
    losses = [F.cross_entropy(logits[i:i + micro].flatten(0, 1),
                              labels[i:i + micro].flatten(), ignore_index=IGNORE)
              for i in range(0, logits.shape[0], micro)]
    return torch.stack(losses).sum() / len(losses)


def per_token_sum(logits, labels, micro: int = 2):
    """Correct: summed token losses per micro-batch, divided by the total token count."""
    total = (labels != IGNORE).sum()
    parts = [F.cross_entropy(logits[i:i + micro].flatten(0, 1), labels[i:i + micro].flatten(),
                             ignore_index=IGNORE, reduction="sum")
             for i in range(0, logits.shape[0], micro)]
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc / total


def batch(seed: int = 0, n: int = 8, length: int = 12, vocab: int = 32):
    """Token ids and labels with very different valid lengths per sequence."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length), generator=g)
    labels = torch.randint(0, vocab, (n, length), generator=g)
    lengths = torch.tensor([12, 2, 11, 3, 12, 1, 9, 5])[:n]
    labels[torch.arange(length)[None, :] >= lengths[:, None]] = IGNORE
    return ids, labels


def main():
    model = TinyLM().eval()
    ids, labels = batch()
    with torch.no_grad():
        logits = model(ids)
    ref = full_batch_loss(logits, labels)
    for name, f in (("per-micro-batch mean (bug)", per_microbatch_mean),
                    ("per-token sum (correct)", per_token_sum)):
        got = f(logits, labels)
        v = fpx.classify(f, full_batch_loss, logits, labels)
        print(f"--- {name}: {got.item():.9g} vs full batch {ref.item():.9g} "
              f"(diff {abs(got.item() - ref.item()):.3g})")
        print(v.report())


if __name__ == "__main__":
    main()
