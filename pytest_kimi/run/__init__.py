"""One run: :class:`~pytest_kimi.run.session.Run` and its steps (bring a layout up, measure it,
search a limit, write its manifest), and the displays that follow it (``progress/``).

Layer 2 of 7 (docs/architecture.md): imports every layer below, never ``plugin`` or ``testing``.
"""
