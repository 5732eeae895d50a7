"""Loopback ports for a private control plane (tools/cluster.sh). The e2e and real-node tiers and
the real-engine benchmark each start one, beside whatever else runs on the machine."""

from __future__ import annotations

import socket


def free_port(pair: bool = False) -> int:
    """A free loopback port (and port+1 too when ``pair``: etcd's peer port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not pair:
            return port
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port pair")


def control_plane_ports() -> dict[str, int]:
    """The ports cluster.sh takes from its environment: API server, etcd (client and peer), controllers."""
    return {"api": free_port(), "etcd": free_port(pair=True), "kcm": free_port(), "scheduler": free_port()}
