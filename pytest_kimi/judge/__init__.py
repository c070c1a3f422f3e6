"""Verdicts on measured layouts: SLO verdicts, the regression gate against a stored baseline,
and the nightly history with its gate (``history/``).

Layer 3 of 7 (docs/architecture.md), beside ``report``: imports ``deploy`` and below.
"""
