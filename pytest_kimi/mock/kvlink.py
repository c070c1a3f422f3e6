"""What moving a prompt's KV cache from a prefill server to a decode server costs.

Prefill/decode disaggregation (SGLang ``--disaggregation-mode``) prefills a prompt on one
replica and decodes it on another, so the prompt's KV cache crosses the network between them.
The mock charges it as bytes over the nodes' links, nothing else:

* **bytes**: an MLA model's cache is one latent vector per token per layer
  (``Profile.kv_bytes_per_token``, 512 + 64 BF16 values for Kimi K2). MLA attention needs the
  whole latent on every attention-TP rank, so each decode TP rank receives its own copy of its
  layers: ``tokens x kv_bytes_per_token x layers x decode TP`` for the whole prompt (SGLang
  sends each decode rank the full cache of one prefill rank for MLA; PP on either side splits
  the layers, not the copies).
* **when**: the prefill sends each chunk's KV as soon as that chunk is prefilled (chunked
  prefill sends as it goes), so only what is left after the last chunk shows in TTFT.
* **how fast**: every byte leaves through the prefill replica's nodes and enters through the
  decode replica's; each side's aggregate bandwidth is ``nodes x inter_node_bw_gbs``. Each
  side is a first-come-first-served link (:class:`Link`): the prefill's egress serialises the
  chunks it sends, the decode's ingress the chunks it receives (from every prefill), and a
  chunk lands when both have passed it (cut-through: the ingress cannot finish before the
  egress has sent the last byte).

Pure: cluster seconds in, cluster seconds out.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_kimi.mock.perfmodel import Profile


def kv_bytes(profile: Profile, tokens: int, decode_tp: int) -> float:
    """Bytes that cross the network for ``tokens`` tokens' KV cache: one copy per decode TP
    rank (MLA's latent is not split over attention heads)."""
    return tokens * profile.kv_bytes_per_token * profile.layers * decode_tp


def side_bandwidth(profile: Profile, nodes: int) -> float:
    """Bytes per cluster second through one side's nodes together."""
    return max(1, nodes) * profile.inter_node_bw_gbs * 1e9


@dataclass(frozen=True)
class Span:
    """A chunk's KV on a link: from ``start`` to ``end`` (cluster seconds), ``size`` bytes."""

    start: float
    end: float
    size: float


class Link:
    """One side's network, first come first served: a chunk waits for the chunks before it."""

    def __init__(self, bandwidth: float) -> None:
        if bandwidth <= 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth}")
        self.bandwidth = bandwidth
        self.free_at = 0.0
        self.moved = 0.0  # bytes, for the mock's own accounting

    def send(self, ready: float, size: float) -> Span:
        """The prefill side: a chunk ready at ``ready`` leaves when the link is free."""
        start = max(ready, self.free_at)
        end = start + size / self.bandwidth
        self.free_at, self.moved = end, self.moved + size
        return Span(start, end, size)

    def receive(self, sent: Span) -> Span:
        """The decode side: a chunk the other side sends over ``sent`` enters when this link
        is free and lands no sooner than its last byte left."""
        start = max(sent.start, self.free_at)
        end = max(start + sent.size / self.bandwidth, sent.end)
        self.free_at, self.moved = end, self.moved + sent.size
        return Span(start, end, sent.size)
