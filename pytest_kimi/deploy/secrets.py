"""Keeping secrets out of everything we write: manifests, logs, reports, terminals.

Two kinds of secret: variables whose NAME looks secret (``HF_TOKEN``, ``*_PASSWORD``), whose
values we redact wherever an environment is shown; and the variables listed in
``env_from_local``, whose values live only in ``ProcessSpec.secret_env`` and reach a node only
through a 0600 file its shell reads and removes (never a command line: :mod:`.remote`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|API_?KEY|CREDENTIAL|PRIVATE", re.I)
REDACTED = "***"


def redact_env(env: Mapping[str, str], secret_names: Collection[str] = ()) -> dict[str, str]:
    """Names kept, values of secret-looking names (and of ``secret_names``) replaced by ``***``."""
    return {
        k: (REDACTED if k in secret_names or SECRET_NAME.search(k) else v) for k, v in env.items()
    }


def env_file_text(env: Mapping[str, str]) -> str:
    """The body of an environment file a POSIX shell sources: ``export NAME='value'`` lines.
    Names were validated (``[A-Za-z_][A-Za-z0-9_]*``); values are quoted, so any byte but NUL
    is read back literally."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
