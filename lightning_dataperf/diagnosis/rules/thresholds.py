"""The share of the step above which a rule calls its stage a bottleneck, shared by the rules and ``diagnose``."""

from __future__ import annotations

__all__ = ["SIGNIFICANT_SHARE"]

#: A stage that costs at least this share of the step is called a bottleneck: below a tenth, removing it
#: altogether would speed the step up by at most 1.11x, within what one epoch's figures can tell apart.
SIGNIFICANT_SHARE = 0.10
