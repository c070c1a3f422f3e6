"""Speculative decoding as the mock models it: which drafts the target accepts, and why.

SGLang 0.5.9's EAGLE family (``--speculative-algorithm EAGLE|EAGLE3|NEXTN|STANDALONE``, top-k
1) runs, for every decode step of a batch, ``num_steps`` forwards of the draft model, each
proposing one more token per request, then one forward of the target over each request's
``num_draft_tokens = num_steps + 1`` positions (the verify). The target keeps the longest
prefix of the drafts it agrees with and adds one token of its own, so a request gains from 1
to ``num_draft_tokens`` tokens per step.

The model here, stated so it can be checked:

* **Acceptance.** Each draft token is accepted with probability ``a``, independently, until the
  first rejection: a step's accepted drafts ``j`` have ``P(j) = a^j (1 - a)`` for ``j < k`` and
  ``a^k`` for ``j = k`` (``k = num_draft_tokens - 1``), so the expected tokens per step (the
  accept length) are ``(1 - a^(k+1)) / (1 - a)``.
* **Where ``a`` comes from.** A drafter accepts more on text whose continuation is predictable.
  The mock sees only the prompt, so it measures that on the prompt: ``r``, the share of the
  prompt's word bigrams that already occurred earlier in it, and ``a = A_MIN + (A_MAX - A_MIN) r``.
  On SPEED-Bench's tiers (the synthetic file) ``r`` is ~0.97 for ``low_entropy``, 0.35-0.58 for
  ``mixed`` and ~0.01 for ``high_entropy``: accept lengths ~3.2, ~2.4 and ~1.9 at 3 steps,
  the span published for Kimi K2-family EAGLE3 drafts at ``--speculative-num-steps 3
  --speculative-eagle-topk 1 --speculative-num-draft-tokens 4`` (2.05 on CEval to 3.2 on
  HumanEval and GSM8K: AQ-MedAI/Kimi-K26-eagle3 and lightseekorg/kimi-k2.7-coder-eagle3.1-mla
  model cards).
* **Draws.** Seeded by the prompt alone: the same prompt accepts the same drafts in every run
  and on every replica, as greedy decoding does.
* **Cost** (:meth:`pytest_kimi.mock.perfmodel.CostModel.draft_time`): each draft forward is a
  one-layer model's roofline on the layout's TP group plus its all-reduces; the verify is a
  target forward over ``num_draft_tokens`` positions per request, so it touches more experts
  than a one-token decode. Prefill chunks also run the draft over their tokens (EAGLE's draft
  extend).

Only top-k 1 chains are modelled (SGLang's default for these models); ``NGRAM`` is refused.
"""

from __future__ import annotations

import itertools
import random
import zlib
from dataclasses import dataclass, field
from typing import Any

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")  # SGLang 0.5.9's choices
MODELLED = ("EAGLE", "EAGLE3", "STANDALONE")  # NEXTN is EAGLE there (server_args.py)
DEFAULT_PARAMS = (3, 1, 4)  # auto_choose_speculative_params: steps, topk, draft tokens
DEFAULT_MAX_RUNNING = 48  # "Max running requests is reset to 48 for speculative decoding"

A_MIN = 0.5  # a draft token's acceptance on text with no repeated bigram
A_MAX = 0.86  # ... on text made of repeats: an accept length of 3.2 at 3 steps


class SpeculativeError(ValueError):
    """A speculative-decoding flag SGLang would refuse, or one the mock does not model."""


@dataclass(frozen=True)
class Speculation:
    """A server's speculative decoding, resolved as SGLang 0.5.9's ``ServerArgs`` does."""

    algorithm: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int

    @property
    def max_drafts(self) -> int:
        """Draft tokens a step can accept (the target adds one more)."""
        return self.num_draft_tokens - 1

    @classmethod
    def from_args(cls, values: dict[str, Any]) -> Speculation | None:
        """``None`` when speculative decoding is off. Raises :class:`SpeculativeError` with
        SGLang's reason for what it refuses (``server_args.py``), or the mock's."""
        algorithm = values.get("speculative_algorithm")
        if algorithm is None:
            return None
        if algorithm == "NEXTN":
            algorithm = "EAGLE"
        if algorithm not in MODELLED:
            raise SpeculativeError(
                f"--speculative-algorithm {algorithm}: the mock models draft-model speculative "
                f"decoding ({', '.join(MODELLED)}, NEXTN); NGRAM's drafts come from n-gram "
                "matches it does not model"
            )
        if values.get("pp_size", 1) > 1:
            raise SpeculativeError(
                "Pipeline parallelism is not compatible with overlap schedule, speculative "
                "decoding, mixed chunked prefill."
            )
        steps = values.get("speculative_num_steps")
        topk = values.get("speculative_eagle_topk")
        drafts = values.get("speculative_num_draft_tokens")
        if steps is None:
            if topk is not None or drafts is not None:
                raise SpeculativeError(
                    "--speculative-eagle-topk and --speculative-num-draft-tokens need "
                    "--speculative-num-steps (SGLang asserts it)"
                )
            steps, topk, drafts = DEFAULT_PARAMS
        if topk is None:  # SGLang 0.5.9 compares None > 1 there and dies with a TypeError
            raise SpeculativeError(
                "--speculative-num-steps needs --speculative-eagle-topk (SGLang 0.5.9 fails "
                "at start-up without it)"
            )
        if topk != 1:
            raise SpeculativeError(
                f"--speculative-eagle-topk {topk}: the mock models top-k 1 draft chains only"
            )
        if steps < 1:
            raise SpeculativeError(f"--speculative-num-steps {steps}: must be at least 1")
        # "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when
        # speculative_eagle_topk == 1"
        return cls(algorithm, steps, topk, steps + 1)


def repeat_share(prompt: str | list[int]) -> float:
    """The share of the prompt's bigrams (of words, or of token ids) seen earlier in it."""
    units = prompt.split() if isinstance(prompt, str) else list(prompt)
    pairs = list(itertools.pairwise(units))
    if not pairs:
        return 0.0
    return (len(pairs) - len(set(pairs))) / len(pairs)


def acceptance(prompt: str | list[int]) -> float:
    """A draft token's acceptance probability for requests with this prompt."""
    return A_MIN + (A_MAX - A_MIN) * repeat_share(prompt)


def accept_length(a: float, max_drafts: int) -> float:
    """Expected tokens per step: ``(1 - a^(k+1)) / (1 - a)``."""
    if a >= 1.0:
        return float(max_drafts + 1)
    return (1.0 - a ** (max_drafts + 1)) / (1.0 - a)


def prompt_seed(prompt: str | list[int]) -> int:
    """The request's draw seed: its prompt's CRC-32. Greedy decoding gives a prompt the same
    drafts and the same verdicts on any replica, so the seed is the prompt's alone: which
    replica the router picked (a race between two requests freed at one instant) changes
    nothing."""
    data = prompt.encode() if isinstance(prompt, str) else repr(prompt).encode()
    return zlib.crc32(data)


@dataclass
class Drafts:
    """One request's drafting: its acceptance, its draws, and SGLang's per-request counts."""

    rate: float
    seed: int
    verify_ct: int = 0
    accepted: int = 0  # draft tokens accepted, over every step
    histogram: list[int] = field(default_factory=list)  # steps by drafts accepted
    _rng: random.Random | None = None

    def step(self, max_drafts: int) -> int:
        """One verify: how many drafts the target accepts (0..max_drafts)."""
        if self._rng is None:
            self._rng = random.Random(self.seed)
        accepted = 0
        while accepted < max_drafts and self._rng.random() < self.rate:
            accepted += 1
        self.verify_ct += 1
        self.accepted += accepted
        if len(self.histogram) <= accepted:
            self.histogram.extend([0] * (accepted + 1 - len(self.histogram)))
        self.histogram[accepted] += 1
        return accepted

    def meta(self, completion_tokens: int, max_drafts: int) -> dict[str, Any]:
        """SGLang 0.5.9's ``meta_info`` keys for a finished request
        (``TokenizerManager._calculate_spec_decoding_metrics``): none before a verify."""
        if self.verify_ct == 0 or max_drafts == 0:
            return {}
        drafted = self.verify_ct * max_drafts
        meta: dict[str, Any] = {
            "spec_accept_rate": self.accepted / drafted,
            "spec_accept_length": completion_tokens / self.verify_ct,
            "spec_accept_token_num": self.accepted,
            "spec_draft_token_num": drafted,
            "spec_verify_ct": self.verify_ct,
        }
        if self.histogram:
            meta["spec_accept_histogram"] = list(self.histogram)
        return meta


@dataclass
class SpecCounters:
    """A server's acceptance as its scheduler counts it (``update_spec_metrics``): tokens per
    request per verify, over a decode-log window (the gauges) and since start-up
    (``/get_server_info``'s ``avg_spec_accept_length``; only ``/set_internal_state`` resets it,
    which the mock does not serve)."""

    window_tokens: int = 0
    window_forwards: int = 0
    total_tokens: int = 0
    total_forwards: int = 0
    accept_length: float = 0.0  # sglang:spec_accept_length, as last logged
    accept_rate: float = 0.0  # sglang:spec_accept_rate
    decode_steps: int = 0
    logged: bool = False  # a decode log has set the gauges (SGLang exports no sample before)

    def verified(self, accepted: int, batch: int, draft_tokens: int, log_every: int) -> None:
        """One verify of ``batch`` requests that accepted ``accepted`` drafts in all; every
        ``log_every`` decode steps the gauges take the window (SGLang's decode log)."""
        self.window_tokens += accepted + batch
        self.window_forwards += batch
        self.decode_steps += 1
        if self.decode_steps % log_every:
            return
        self.logged = True
        self.accept_length = self.window_tokens / self.window_forwards
        # SGLang divides tokens (accepted drafts plus the target's own) by drafted positions
        self.accept_rate = self.window_tokens / (self.window_forwards * draft_tokens)
        self.total_tokens += self.window_tokens
        self.total_forwards += self.window_forwards
        self.window_tokens = self.window_forwards = 0

    def decoded(self, log_every: int) -> None:
        """A decode step of a server that does not speculate: its decode logs set both
        gauges to 0 (``log_decode_stats``)."""
        self.decode_steps += 1
        if self.decode_steps % log_every == 0:
            self.logged = True

    def average(self) -> float | None:
        """``avg_spec_accept_length``: absent until a decode log has counted a forward."""
        if self.total_forwards == 0:
            return None
        return self.total_tokens / self.total_forwards
