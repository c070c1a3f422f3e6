"""Keeping secrets out of everything we write: manifests, logs, reports, terminals."""

from __future__ import annotations

import re
from collections.abc import Mapping

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|API_?KEY|CREDENTIAL|PRIVATE", re.I)
REDACTED = "***"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Names kept, values of secret-looking names replaced by ``***``."""
    return {k: (REDACTED if SECRET_NAME.search(k) else v) for k, v in env.items()}
