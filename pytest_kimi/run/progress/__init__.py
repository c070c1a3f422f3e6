"""Progress of a run, as events: what bring-up and measuring report, and how it is shown.

:mod:`.events` is what the steps emit (no dependencies), :mod:`.model` folds events into the
state a display shows, :mod:`.plain` prints lines (logs, CI, xdist), :mod:`.live` draws a
rich display on a terminal, :mod:`.terminal` picks one for a pytest session.
"""
