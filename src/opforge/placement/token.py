"""Where ``opforge pd serve`` and ``opforge pd ctl`` get the bearer token:
``--token-file PATH`` (the file's first line), else ``$OPFORGE_PD_TOKEN``.

``--token T`` still works but is deprecated: the command line of a running
process is visible to every user of the machine (``ps``, /proc), so a token
passed there is not a secret."""

from __future__ import annotations

import os
import sys

ENV = "OPFORGE_PD_TOKEN"


class TokenError(ValueError):
    pass


def read_token(token: str | None = None, token_file: str | None = None, *, command: str = "opforge pd") -> str | None:
    """The token, from the file, the deprecated argument or the environment
    (in that order); None when none is given. TokenError for an unreadable or
    empty file."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                text = f.readline().strip()
        except OSError as e:
            raise TokenError(f"{command}: cannot read --token-file {token_file}: {e.strerror or e}") from None
        if not text:
            raise TokenError(f"{command}: --token-file {token_file} is empty")
        return text
    if token:
        print(f"{command}: warning: --token is deprecated: the command line is visible to other users in ps; "
              f"set {ENV} or pass --token-file PATH", file=sys.stderr)
        return token
    return os.environ.get(ENV) or None
