"""Which URLs may be instances, and how a URL is printed.

:func:`instance_url_problem` is the one rule every source of instances goes through (``--prefill`` /
``--decode``, ``--instances-file``, ``--stack``, Kubernetes discovery, ``POST /admin/instances/add``, and
any :class:`~ascend_runtime.proxy.instances.InstanceSpec` built in Python). It refuses:

- **credentials in the URL** (``http://user:password@host:port``): the proxy would send them nowhere
  (it authenticates to engines with the client's ``Authorization`` header), and the URL is printed in
  logs, the admin listing and, through default instance names, metric labels;
- **addresses that are no engine's**: link-local (169.254.0.0/16 and fe80::/10, where cloud metadata
  services answer, e.g. 169.254.169.254), multicast (224.0.0.0/4, ff00::/8) and unspecified (0.0.0.0,
  ::) addresses, including an IPv4 address inside IPv6 (``::ffff:169.254.169.254``) and the other
  spellings the system resolver reads as IPv4 (``2852039166``, ``0xa9fea9fe``, ``169.254.43518``,
  ``0251.0376.0251.0376``). Loopback (127.0.0.0/8, ::1) stays allowed: the local stack serves there.

Host names are not resolved here: a name is looked up when the proxy connects, possibly to other
addresses later, so the rule covers addresses written in the URL.

:func:`redact` replaces the credentials of every URL in a text with ``***``; messages that quote what a
user gave as an instance URL go through it, so a password never reaches a log line or an answer.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: ``scheme://userinfo@`` of a URL inside any text (userinfo: up to the first ``@``, no space, quote or angle
#: bracket; a ``/`` is taken in, so a password with an unescaped ``/`` is redacted too)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s@\"'<>]*@")
#: host spellings ``inet_aton`` reads as an IPv4 address (decimal, octal, hex parts; one to four of them)
_IPV4_SPELLING = re.compile(r"(?i)^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***`` (``http://***@host:port``)."""
    return _USERINFO.sub(r"\1***@", text)


def host_address(host: str) -> IPAddress | None:
    """The IP address a URL host stands for when it is written as one (any spelling the resolver reads as
    an address, IPv6 without brackets), else None (a name)."""
    host = host.rstrip(".") if host.count(".") else host
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) is no part of it
    except ValueError:
        pass
    if _IPV4_SPELLING.match(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def address_problem(address: IPAddress) -> str | None:
    """Why ``address`` cannot be an instance's (the module docstring's list), or None."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_unspecified:
        return "an unspecified address (0.0.0.0 or ::) names no host to connect to"
    if address.is_link_local:
        return ("a link-local address (169.254.0.0/16, fe80::/10) is no engine's; cloud metadata services answer "
                "there (169.254.169.254)")
    if address.is_multicast:
        return "a multicast address (224.0.0.0/4, ff00::/8) is no single engine's"
    return None


def instance_url_problem(url: str) -> str | None:
    """Why ``url`` (``scheme://host:port[/path]``) cannot be an instance's, or None; the message never quotes
    the URL's credentials."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return ("credentials in the URL (user:password@) are not allowed: the proxy prints instance URLs in logs, "
                "the admin listing and metric labels; give http://host:port")
    address = host_address(parts.hostname or "")
    if address is None:
        return None
    why = address_problem(address)
    return None if why is None else f"host {parts.hostname}: {why}"
