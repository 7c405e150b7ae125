"""Whether a no-warmup arm holds against its comparator: source use first, BLEU at convergence, loss as the
early signal (lab/record/testbed-d128.md, batch 7).

Validation loss alone cannot judge a translation model: a decoder that ignores its silenced encoder is a
language model, whose loss falls faster than a translation model's. So an arm holds only if

- at every validation both arms logged from :data:`FROM_UPDATE` on, its source gap (the loss with the sources
  rolled across the batch minus the loss, ``valid_src_gap``) is not more than :data:`SOURCE_GAP_MARGIN` bits below
  the comparator's, and
- its eval-mode loss at the last validation both logged is not more than :data:`LOSS_MARGIN` bits above the
  comparator's (the mission is training without warmup as well as with it; a model that uses its source but
  whose eval-mode loss is far above the comparator's, as under scales that break it in eval mode, does not), and
- where BLEU decides (at convergence), its BLEU is at or above the comparator's.

A lower loss never makes an arm hold: it is reported beside the verdict, never instead of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

#: How far (bits per token) an arm's source gap may fall below its comparator's at a validation: wider than the
#: spread between the testbed's models that translate, narrower than how far those that ignore their source fall
#: short (lab/record/testbed-d128.md, batches 7-9).
SOURCE_GAP_MARGIN = 0.5
#: Validations before this update are not judged: every model starts with a gap of about 0.
FROM_UPDATE = 500
#: How far (bits per token) an arm's eval-mode loss may end above its comparator's: the same half bit.
LOSS_MARGIN = 0.5

Curve = Mapping[int, float]


@dataclass(frozen=True)
class Verdict:
    """An arm against its comparator: ``holds`` (None: nothing to judge), the reasons it fails, and the
    numbers behind it."""

    arm: str
    comparator: str
    holds: Optional[bool]
    reasons: Tuple[str, ...] = ()
    #: update -> comparator's gap minus the arm's (positive: the arm uses its source less)
    gap_shortfall: Dict[int, float] = field(default_factory=dict)
    loss: Optional[float] = None
    comparator_loss: Optional[float] = None
    loss_update: Optional[int] = None
    bleu: Optional[float] = None
    comparator_bleu: Optional[float] = None

    def line(self) -> str:
        if self.holds is None:
            return f"{self.arm} vs {self.comparator}: not judged ({'; '.join(self.reasons)})"
        worst = max(self.gap_shortfall.items(), key=lambda kv: kv[1]) if self.gap_shortfall else None
        gap = f"largest gap shortfall {worst[1]:+.2f} bits at {worst[0]}" if worst else "no gap compared"
        word = "holds" if self.holds else "fails: " + "; ".join(self.reasons)
        return f"{self.arm} vs {self.comparator}: {word} ({gap})"


def judge(name: str, curves: Mapping[str, Curve], comparator: str, comparator_curves: Mapping[str, Curve], *,
          bleu: Optional[float] = None, comparator_bleu: Optional[float] = None, bleu_decides: bool = False,
          margin: float = SOURCE_GAP_MARGIN, from_update: int = FROM_UPDATE,
          loss_margin: float = LOSS_MARGIN) -> Verdict:
    """The verdict of arm ``name`` (its curves: ``valid_src_gap``, ``valid_loss``) against ``comparator``."""
    gap, ref = curves.get("valid_src_gap") or {}, comparator_curves.get("valid_src_gap") or {}
    updates = sorted(u for u in set(gap) & set(ref) if u >= from_update)
    loss, ref_loss = curves.get("valid_loss") or {}, comparator_curves.get("valid_loss") or {}
    common = sorted(set(loss) & set(ref_loss))
    numbers = dict(loss=loss[common[-1]] if common else None, comparator_loss=ref_loss[common[-1]] if common else None,
                   loss_update=common[-1] if common else None, bleu=bleu, comparator_bleu=comparator_bleu)
    if not updates:
        return Verdict(name, comparator, None, (f"no source gap logged by both from update {from_update}",),
                       **numbers)
    shortfall = {u: round(ref[u] - gap[u], 4) for u in updates}
    reasons = [f"source gap {round(gap[u], 2) + 0.0:.2f} bits at {u}, {shortfall[u]:.2f} below {comparator}'s"
               for u in updates if shortfall[u] > margin][:1]
    if common and loss[common[-1]] - ref_loss[common[-1]] > loss_margin:
        u = common[-1]
        reasons.append(f"eval-mode loss {loss[u]:.2f} at {u}, {loss[u] - ref_loss[u]:.2f} above {comparator}'s")
    if bleu_decides:
        if bleu is None or comparator_bleu is None:
            return Verdict(name, comparator, None, ("BLEU decides here but is missing",), shortfall, **numbers)
        if bleu < comparator_bleu:
            reasons.append(f"BLEU {bleu:.2f} below {comparator}'s {comparator_bleu:.2f}")
    return Verdict(name, comparator, not reasons, tuple(reasons), shortfall, **numbers)
