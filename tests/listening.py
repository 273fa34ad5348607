"""Which addresses the processes a test started listen on: what the loopback-only tests check."""

from __future__ import annotations

import ipaddress

import psutil


def listening(*roots: int) -> dict[str, set[str]]:
    """The addresses the processes ``roots`` and their children listen on, each with the names of
    the processes listening there."""
    processes: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            processes |= {p.pid: p for p in (root, *root.children(recursive=True))}
        except psutil.NoSuchProcess:
            continue
    found: dict[str, set[str]] = {}
    for process in processes.values():
        try:
            connections = process.net_connections(kind="inet")
            name = process.name()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        for c in connections:
            if c.status == psutil.CONN_LISTEN:
                found.setdefault(c.laddr.ip, set()).add(name)
    return found


def not_loopback(found: dict[str, set[str]]) -> dict[str, set[str]]:
    """The addresses other than 127.0.0.1 and ::1 (an IPv4-mapped 127.0.0.1 is loopback too)."""
    def loopback(ip: str) -> bool:
        address = ipaddress.ip_address(ip.split("%")[0])
        mapped = getattr(address, "ipv4_mapped", None)
        return (mapped or address) in (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))

    return {ip: names for ip, names in found.items() if not loopback(ip)}
