"""The Ray address a user gives (``RAY_ADDRESS``): parsed, and checked to be a Ray cluster before
``ray.init`` joins it.

``ray.init`` retries an address where nothing listens for about a minute, and one where something
else listens (an HTTP server, the dashboard's port, any TCP listener that never speaks Ray's
protocol) for as long: a failure named that late looks like a hang. Both of Ray's servers that an
address names, the GCS (``HOST:PORT``) and the Ray Client server (``ray://HOST:PORT``), are gRPC
servers, which answer an HTTP/2 connection preface at once with their own SETTINGS frame; anything
else is named here within seconds.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from dataclasses import dataclass

CLIENT_SCHEME = "ray://"
CONNECT_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 2.0  # a gRPC server answers in milliseconds (its transport does, however busy its service)
FORM = "HOST:PORT or ray://HOST:PORT, an IPv6 address in brackets ([::1]:6379)"

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_EMPTY_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # length 0, type SETTINGS, no flags, stream 0
H2_FRAME_HEADER = 9
H2_SETTINGS, H2_ACK = 4, 1


@dataclass(frozen=True)
class RayAddress:
    """``host`` without brackets (``::1``); ``client``: a Ray Client address (``ray://``)."""

    host: str
    port: int
    client: bool = False

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{CLIENT_SCHEME if self.client else ''}{host}:{self.port}"


def parse_ray_address(address: str) -> RayAddress:
    """``10.0.0.5:6379``, ``[::1]:6379``, ``ray://head:10001`` -> RayAddress; ValueError (one line,
    without the value, which the caller names) for anything else."""
    if address != address.strip():
        raise ValueError(f"has spaces around it: expected {FORM}")
    client = address.startswith(CLIENT_SCHEME)
    rest = address.removeprefix(CLIENT_SCHEME)
    if rest.endswith("/"):
        raise ValueError(f"ends with '/', which Ray does not take: expected {FORM}")
    if "://" in rest:
        scheme = rest.partition("://")[0]
        raise ValueError(f"{scheme}:// is not Ray's (an http:// URL is its dashboard's): expected {FORM}")
    if rest.startswith("["):
        inside, bracket, port = rest[1:].partition("]")
        if not bracket or not port.startswith(":"):
            raise ValueError(f"has no ']:PORT' after the IPv6 address: expected {FORM}")
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise ValueError(f"{inside!r} is no IPv6 address: expected {FORM}") from None
        host, port = inside, port[1:]
    else:
        host, colon, port = rest.rpartition(":")
        if not colon:
            raise ValueError(f"has no port: expected {FORM}")
        if ":" in host:
            raise ValueError(f"an IPv6 address needs brackets: [{host}]:{port}")
        if not host:
            raise ValueError(f"has no host: expected {FORM}")
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"port {port!r} is not from 1 to 65535: expected {FORM}")
    return RayAddress(host, int(port), client)


def check_ray_joins(address: RayAddress) -> None:
    """``check_ray_answers`` at ``address``, and at the address ``ray.init`` dials for it where that is
    another: Ray replaces a loopback host (127.0.0.1, localhost, ::1) by this machine's IP, where a
    cluster started on loopback alone does not listen (ray.init retried there for minutes)."""
    check_ray_answers(address)
    if address.client:
        return
    from ray._private.services import canonicalize_bootstrap_address

    dialed_text = canonicalize_bootstrap_address(str(address))
    dialed = parse_ray_address(dialed_text) if dialed_text else address
    if (dialed.host, dialed.port) == (address.host, address.port):
        return
    try:
        check_ray_answers(dialed)
    except ConnectionError as e:
        raise ConnectionError(
            f"Ray answers at {address}, but ray.init dials {dialed} for it (Ray replaces a loopback address by "
            f"this machine's IP), and there {e}: give the cluster's address on this machine's IP, or set "
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 to keep loopback addresses (a cluster of this machine alone)"
        ) from None


def check_ray_answers(address: RayAddress) -> None:
    """ConnectionError in one line, within seconds, unless a gRPC server (a Ray GCS or Ray Client
    server) answers at ``address``."""
    try:
        with socket.create_connection((address.host, address.port), timeout=CONNECT_TIMEOUT_S) as conn:
            if _ray_uses_tls():  # its servers expect a TLS handshake, which ray.init makes
                return
            conn.sendall(H2_PREFACE + H2_EMPTY_SETTINGS)
            answer = _read_at_least(conn, H2_FRAME_HEADER, ANSWER_TIMEOUT_S)
    except OSError as e:
        raise ConnectionError(f"nothing answers at {address} ({e})") from None
    if answer is None:
        raise ConnectionError(f"something listens at {address} but gives no answer in Ray's protocol (gRPC) "
                              f"within {ANSWER_TIMEOUT_S:g} s: not a Ray cluster")
    if answer.startswith(b"HTTP/"):
        raise ConnectionError(f"an HTTP server answers at {address}, not a Ray cluster (the dashboard's port? "
                              f"Ray's GCS listens on 6379 unless told otherwise)")
    if len(answer) < H2_FRAME_HEADER or answer[3] != H2_SETTINGS or answer[4] & H2_ACK:
        raise ConnectionError(f"something at {address} answers, but not in Ray's protocol (gRPC): not a Ray cluster")


def _read_at_least(conn: socket.socket, n: int, timeout_s: float) -> bytes | None:
    """What the peer sent until ``n`` bytes or its end of the connection; None if it sent nothing
    within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        conn.settimeout(left)
        try:
            chunk = conn.recv(n - len(data))
        except TimeoutError:
            break
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    return data or None


def _ray_uses_tls() -> bool:
    return os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
