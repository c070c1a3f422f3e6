"""What a run produced and how it is kept: per-request records, figures and their statistics,
SLO verdicts, a layout's result, counters read from the servers, progress events, the run
folder on disk.

The lowest layer (docs/architecture.md): imports nothing else of pytest-kimi, so every layer
can read and write results the same way.
"""
