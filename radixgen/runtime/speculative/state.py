"""SpecState: one request's speculative-decoding state (its n-gram index, acceptance record, counters).

Written on the scheduler thread only: by the Speculator when it proposes drafts and when a
verification result is processed.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.runtime.speculative.ngram import NgramIndex

EVIDENCE_DECAY = 0.85  # weight kept by older verifications at each new one (recent acceptance counts most)
IDLE_DECAY = 0.97  # weight kept at each step the request could draft but does not: low acceptance is retried
PRIOR_WEIGHT = 2.0  # the prior acceptance counts as this many observed draft tokens


@dataclass
class SpecState:
    """Acceptance evidence (`hits` accepted out of `trials` verified draft tokens, decayed) and the
    counters reported in meta_info (SGLang's names)."""

    index: NgramIndex
    hits: float = 0.0
    trials: float = 0.0
    verify_ct: int = 0  # forward steps that gave the request tokens
    proposed: int = 0  # draft tokens verified
    accepted: int = 0  # of which accepted
    match: int = 0  # suffix-match length of the latest lookup (its drafts' evidence goes to that length's prior)

    def accept_prob(self, prior: float) -> float:
        """Estimated chance that the next draft token is accepted, given the ones before it were."""
        return (self.hits + prior * PRIOR_WEIGHT) / (self.trials + PRIOR_WEIGHT)

    def record(self, proposed: int, accepted: int) -> None:
        """A verification: `accepted` of `proposed` draft tokens were the target's tokens."""
        self.verify_ct += 1
        self.proposed += proposed
        self.accepted += accepted
        if proposed:
            self.hits = self.hits * EVIDENCE_DECAY + accepted
            self.trials = self.trials * EVIDENCE_DECAY + accepted + (accepted < proposed)

    def pass_up(self) -> None:
        """The request could have drafted but did not: let old evidence fade, so drafting is retried."""
        self.hits *= IDLE_DECAY
        self.trials *= IDLE_DECAY

    def meta_info(self, completion_tokens: int) -> dict[str, float | int]:
        return {
            "spec_verify_ct": self.verify_ct,
            "spec_num_proposed_drafts": self.proposed,
            "spec_num_correct_drafts": self.accepted,
            "spec_accept_rate": self.accepted / self.proposed if self.proposed else 0.0,
            "spec_accept_length": completion_tokens / self.verify_ct if self.verify_ct else 0.0,
        }
