"""The CUDA-graph decoder: ``LanguageModel.generate``'s one-token step recorded once and replayed."""
from __future__ import annotations

import torch


class DecodeGraph:
    """The one-token decoding step recorded once as a CUDA graph and replayed for each later token of a decode.

    On a GPU a small model's decoding step is bound by kernel launches, one per dispatched op, each paid
    by the host; a replayed graph launches them all at once. :meth:`record` runs the step eagerly on a
    side stream (the warm-up a capture needs; its logits are this token's), then records it reading the
    token ids and positions from buffers of its own, and the attention mask and the preallocated key/value
    cache in place (the cache advances its own position on the device). Calling the graph copies the next
    token's ids and positions in and replays it: the logits come back in the same tensor each time. Within
    a decode everything the step reads stays at its address: the weights, a population's drawn factors,
    the mask and the cache."""

    def __init__(self, graph, ids, positions, logits):
        self.graph, self.ids, self.positions, self.logits = graph, ids, positions, logits

    @staticmethod
    def stream(device):
        """A side stream of ``device`` that has waited for its current stream (the stream a graph records on)."""
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        return side

    @classmethod
    def record(cls, step, ids, mask, positions, cache, stream):
        """``(logits, graph, error)``: ``step(ids, mask, positions, cache)`` run once on ``stream``, then recorded
        there. Where recording fails, ``graph`` is None and ``error`` says why: the step has run once either way
        (the cache advanced by this token), and a failed recording has run nothing."""
        dev = ids.device
        ids, positions = ids.clone(), positions.clone()
        graph, error = torch.cuda.CUDAGraph(), None
        with torch.cuda.stream(stream):
            first = step(ids, mask, positions, cache)[0].clone()
            try:
                graph.capture_begin()
                try:
                    logits = step(ids, mask, positions, cache)[0]
                finally:
                    graph.capture_end()
            except Exception as err:  # an op the step runs that a graph cannot hold (a host read, ...)
                error = err
        torch.cuda.current_stream(dev).wait_stream(stream)
        return first, (None if error else cls(graph, ids, positions, logits)), error

    def __call__(self, ids, positions):
        self.ids.copy_(ids)
        self.positions.copy_(positions)
        self.graph.replay()
        return self.logits
