"""An owner as written by people (`user`, `user:group`, names or numbers), resolved on
this host: the one parser for the spec's `filesystem.owner`, apply's chown check and
`copy --owner`."""

from __future__ import annotations

import grp
import pwd
from dataclasses import dataclass


@dataclass(frozen=True)
class Owner:
    uid: int | None             # None: no such user
    gid: int | None             # None: no group given, or no such group
    group_given: bool
    missing: tuple[str, ...]    # "user 'x'", "group 'y'": what does not exist here


def parse_owner(text: str) -> Owner:
    """'train:train', 'train', '1000:1000' -> an Owner; numbers are taken as they are."""
    user, _, group = text.partition(":")
    missing = []
    try:
        uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
    except KeyError:
        uid = None
        missing.append(f"user {user!r}")
    gid = None
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            missing.append(f"group {group!r}")
    return Owner(uid, gid, bool(group), tuple(missing))
