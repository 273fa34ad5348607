"""Ray that cannot be reached: an explicit --backend ray is a user error, auto falls back."""

from __future__ import annotations

import logging
import socket
import socketserver
import subprocess
import threading
import time

import pytest

from rec.errors import InputError
from rec.planning import plan_spec
from rec.spec.synthetic import power_law_spec
from rec.topology import topology_from_dict
from tasks.ray_search import AutoSearcher, connect
from tests.paths import CPU_2PROC, DEMO, ROOT, SHARDFLOW

TOPO = topology_from_dict(dict(world_size=8, compute_device="cuda", hbm_cap="80GiB", ddr_cap="128GiB"))


def plan_on_ray(out, address: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(SHARDFLOW), "plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out",
                           str(out), "--backend", "ray"], capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RAY_ADDRESS": address})


@pytest.mark.slow
def test_without_an_address_ray_search_starts_its_own_ray_and_prints_only_its_progress(tmp_path):
    """Ray's notice of its token authentication was printed without -v (README: a library's output is
    shown with -v only)."""
    r = subprocess.run([str(SHARDFLOW), "plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out",
                        str(tmp_path / "p"), "--backend", "ray", "--no-chart"], capture_output=True, text=True,
                       timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p" / "plan.json").is_file()
    assert all(line.startswith("search: ") for line in r.stderr.splitlines()), r.stderr  # progress, on long work


def test_unreachable_cluster_with_explicit_ray_backend_exits_2(tmp_path):
    r = plan_on_ray(tmp_path / "p", "127.0.0.1:1")
    assert r.returncode == 2
    assert "Cannot reach the Ray cluster" in r.stderr and "127.0.0.1:1" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "p").exists()


def test_a_listener_that_is_no_ray_cluster_is_named_in_one_line_within_seconds(tmp_path):
    """It was taken as reachable, and ray.init failed only after about a minute."""
    # not served: the kernel accepts connections, nothing ever answers
    with socketserver.TCPServer(("127.0.0.1", 0), socketserver.BaseRequestHandler) as listener:
        address = f"127.0.0.1:{listener.server_address[1]}"
        started = time.monotonic()
        r = plan_on_ray(tmp_path / "p", address, timeout=30)
        took = time.monotonic() - started
    assert r.returncode == 2 and took < 10, (took, r.stderr)
    problems = [line for line in r.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and address in problems[0] and "not a Ray cluster" in problems[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "p").exists()


class AnswersGRPC(socketserver.BaseRequestHandler):
    """The first frame every gRPC server (Ray's GCS) sends: SETTINGS, empty."""

    def handle(self) -> None:
        self.request.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        self.request.recv(64)


def test_a_cluster_on_loopback_alone_that_ray_would_dial_elsewhere_is_named_within_seconds():
    """Ray replaces a loopback RAY_ADDRESS by this machine's IP (unless it runs single-machine): a
    cluster listening on 127.0.0.1 alone answered the check, and ray.init retried the other address
    for minutes."""
    from ray._private.services import canonicalize_bootstrap_address

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), AnswersGRPC) as server:
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        address = f"127.0.0.1:{server.server_address[1]}"
        dialed = canonicalize_bootstrap_address(address)
        if dialed == address:
            pytest.skip("Ray keeps loopback addresses on this machine (no other IP)")
        started = time.monotonic()
        with pytest.raises(InputError) as refused:
            connect(address)
        server.shutdown()
    assert time.monotonic() - started < 15
    (problem,) = refused.value.problems
    assert f"ray.init dials {dialed} for it" in problem.reason
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in problem.reason


class AnswersHTTP(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


class IPv6Server(socketserver.ThreadingTCPServer):
    address_family = socket.AF_INET6
    daemon_threads = True


@pytest.fixture
def http_on_ipv6_loopback():
    try:
        server = IPv6Server(("::1", 0), AnswersHTTP)
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here ({e})")
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_ipv6_address_is_reached_and_what_answers_there_named(http_on_ipv6_loopback, scheme):
    """``[::1]:PORT`` was split at its last colon and never reached ("nothing answers")."""
    address = f"{scheme}[::1]:{http_on_ipv6_loopback}"
    with pytest.raises(InputError) as refused:
        connect(address)
    (problem,) = refused.value.problems
    assert problem.where == f"RAY_ADDRESS={address}"
    assert problem.reason.startswith(f"an HTTP server answers at {address}, not a Ray cluster")


@pytest.mark.parametrize(("address", "why"), [
    ("::1:6379", "an IPv6 address needs brackets: [::1]:6379"),
    ("[::1:6379", "has no ']:PORT' after the IPv6 address"),
    ("[head]:6379", "'head' is no IPv6 address"),
    ("ray://head", "has no port"),
    ("head:65536", "port '65536' is not from 1 to 65535"),
    ("http://head:8265", "http:// is not Ray's"),
    (" head:6379", "has spaces around it"),
    ("ray://head:10001/", "ends with '/', which Ray does not take"),
])
def test_a_malformed_address_is_refused_in_one_line_naming_it(address, why):
    with pytest.raises(InputError) as refused:
        connect(address)
    (problem,) = refused.value.problems
    assert problem.where == f"RAY_ADDRESS={address}" and problem.reason.startswith(why)


def test_auto_falls_back_to_local_with_a_warning_when_ray_is_unreachable(monkeypatch, caplog):
    spec = power_law_spec(200, seed=1)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with caplog.at_level(logging.WARNING, logger="tasks.ray_search"):
        plan = plan_spec(spec, TOPO, searcher=AutoSearcher(min_tables=10))
    assert "searching locally" in caplog.text
    assert plan.plan_id == plan_spec(spec, TOPO).plan_id
