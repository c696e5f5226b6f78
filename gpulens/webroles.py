"""Dashboard roles: viewers read; operators also act (silence alerts; acknowledge and resume remediation).

A visitor's role comes from one of two places, chosen by the dashboard's flags:
- the basic-auth file: a third field on a user's line, ``alice:$2y$...:operator`` (no field, or ``viewer``: a viewer);
- a header set by the site's reverse proxy after its own sign-on (``--role-header X-Gpulens-Role``), whose value is
  ``operator`` or anything else (a viewer). Only a proxy that sets it on every request, overwriting what the client
  sent, may be trusted with it: the dashboard must then be reachable through that proxy only.
Without either, every visitor is an operator: the dashboard listens on loopback unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

VIEWER: Final = "viewer"
OPERATOR: Final = "operator"
ROLES: Final = (VIEWER, OPERATOR)


@dataclass(frozen=True)
class RolePolicy:
    """Where roles come from: the auth file's users (``user -> role``), a proxy's header, or neither."""

    users: Mapping[str, str] = field(default_factory=dict)
    header: str | None = None
    auth: bool = False  # basic auth is on: a user missing from ``users`` is a viewer

    def role(self, user: str | None, header_value: str | None) -> str:
        """The role of a request by ``user`` (the basic-auth user, if any) whose ``header`` had ``header_value``."""
        if self.header is not None:
            return OPERATOR if (header_value or "").strip().lower() == OPERATOR else VIEWER
        if self.auth:
            return self.users.get(user or "", VIEWER)
        return OPERATOR
