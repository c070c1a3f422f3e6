"""Project root conftest: pytest-kimi is loaded through its ``pytest11`` entry point.

When the package is not installed (a bare checkout on ``PYTHONPATH``), load the plugin here
so ``pytest tests/perf`` still works.
"""

from importlib import metadata

_installed = any(ep.value == "pytest_kimi.plugin" for ep in metadata.entry_points(group="pytest11"))
pytest_plugins = [] if _installed else ["pytest_kimi.plugin"]
