"""Which Host headers the server answers: the guard against DNS rebinding.

A web page cannot read a keyless server on 127.0.0.1 directly (the browser's same-origin rule),
but it can point its own domain's DNS at 127.0.0.1 and send requests that carry its own name as
the Host. So a server bound to a loopback address answers only the loopback names (localhost,
127.0.0.1, [::1]) and the names an operator adds with --allowed-hosts ("*": any). A server bound
to another address was exposed on purpose; it checks Host only when --allowed-hosts is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from treeflash.errors import InvalidRequestError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(address: str) -> bool:
    address = address.strip("[]").lower()
    return address in ("localhost", "::1") or address.startswith("127.")


def host_name(header: str) -> str:
    """'Example.com:8000' -> 'example.com', '[::1]:8000' -> '::1' (the port never matters)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0].rstrip(".") if header.count(":") == 1 else header.rstrip(".")


@dataclass(frozen=True)
class HostPolicy:
    bound: str | None = None  # the address the server listens on; None: an app without a socket (no check)
    allowed: tuple[str, ...] = ()  # extra names (--allowed-hosts); "*" allows any

    def __post_init__(self) -> None:
        for name in self.allowed:
            if not name or any(c in name for c in " /\\@"):
                raise InvalidRequestError(f"--allowed-hosts: {name!r} is not a host name", "allowed_hosts")

    @property
    def checks(self) -> bool:
        if "*" in self.allowed or self.bound is None:
            return False
        return is_loopback(self.bound) or bool(self.allowed)

    def allows(self, header: str | None) -> bool:
        if not self.checks:
            return True
        if not header:
            return False
        name = host_name(header)
        return name in LOOPBACK_NAMES or name in (host_name(a) for a in self.allowed) or (
            self.bound is not None and name == host_name(self.bound))
