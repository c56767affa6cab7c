"""The push API over real HTTP against uvicorn on 127.0.0.1."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    delete_from_gateway,
    push_to_gateway,
    pushadd_to_gateway,
)

from fleetscope.collectors.steps import StepsCollector
from fleetscope.config import load
from fleetscope.serve.daemon import build_daemon
from fleetscope_sim.harness import eventually
from tests.clocks import FakeClock
from tests.push.live import running_daemon

PUSHERS = 8
RECORDS_PER_PUSHER = 10_000
RANKS = 4  # every pusher writes to the same four ranks: maximum contention on shared state


def _push_all(url: str, pusher: int, errors: list[str]) -> None:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    # Even pushers send big batches (parsed on the threadpool), odd ones small (parsed on the event loop).
    batch_size = 1000 if pusher % 2 == 0 else 100
    try:
        for start in range(0, RECORDS_PER_PUSHER, batch_size):
            batch = [
                {
                    "job": "concurrent",
                    "rank": i % RANKS,
                    "step": i,
                    "step_seconds": 0.5,
                    "data_seconds": 0.25,
                    "compute_seconds": 0.125,
                    "comm_seconds": 0.0625,
                    "tokens": 3,
                    "samples": 1,
                }
                for i in range(start, start + batch_size)
            ]
            body = json.dumps(batch)
            connection.request("POST", "/api/v1/steps", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            payload = response.read()
            if response.status != 200 or json.loads(payload) != {"accepted": batch_size}:
                errors.append(f"pusher {pusher}: {response.status} {payload[:200]!r}")
                return
    except Exception as exc:  # reported by the test thread
        errors.append(f"pusher {pusher}: {exc!r}")
    finally:
        connection.close()


def test_concurrent_pushers_lose_and_double_count_nothing() -> None:
    with running_daemon({"push.max-body-bytes": 1 << 22}) as daemon:
        errors: list[str] = []
        threads = [threading.Thread(target=_push_all, args=(daemon.url, p, errors)) for p in range(PUSHERS)]
        scrapes = 0
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            daemon.scrape()  # scrapes interleave with pushes: they must neither fail nor disturb counts
            scrapes += 1
        for thread in threads:
            thread.join()
        assert errors == []
        samples = daemon.scrape()
    total = PUSHERS * RECORDS_PER_PUSHER
    per_rank = total // RANKS

    def value(name: str, rank: int) -> float:
        return samples[
            (
                name,
                (("local_rank", ""), ("pp_stage", ""), ("rank", str(rank)), ("training_job", "concurrent")),
            )
        ]

    for rank in range(RANKS):
        assert value("fleetscope_training_steps_total", rank) == per_rank
        assert value("fleetscope_training_step_seconds_total", rank) == per_rank * 0.5
        assert value("fleetscope_training_data_seconds_total", rank) == per_rank * 0.25
        assert value("fleetscope_training_compute_seconds_total", rank) == per_rank * 0.125
        assert value("fleetscope_training_comm_seconds_total", rank) == per_rank * 0.0625
        assert value("fleetscope_training_tokens_total", rank) == per_rank * 3
        assert value("fleetscope_training_samples_total", rank) == per_rank
        assert value("fleetscope_training_step_seconds_median", rank) == 0.5
    assert samples[("fleetscope_push_records_total", ())] == total
    assert scrapes >= 1


def test_declared_oversized_body_is_refused_without_reading_it() -> None:
    with running_daemon({"push.max-body-bytes": 1024}) as daemon:
        parts = urlsplit(daemon.url)
        with socket.create_connection((parts.hostname, parts.port), timeout=20) as sock:
            # Announce 100 MB and send nothing more: a server that tried to read the body would wait forever.
            sock.sendall(
                b"POST /api/v1/steps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000000\r\n\r\n["
            )
            reply = sock.recv(4096).decode()
        assert reply.startswith("HTTP/1.1 413")
        assert daemon.value("fleetscope_push_rejected_total", reason="too_large") == 1


def test_push_to_gateway_then_group_expires() -> None:
    clock = FakeClock(1_700_000_000.0)
    with running_daemon({"push.group-ttl": "60s"}, clock=clock) as daemon:
        registry = CollectorRegistry()
        Gauge("batch_loss", "Loss of the last batch.", registry=registry).set(0.75)
        Counter("batch_examples", "Examples.", registry=registry).inc(32)
        gateway = daemon.url.removeprefix("http://")
        push_to_gateway(gateway, job="nightly", registry=registry, grouping_key={"rank": "1", "path": "a/b"})
        labels = {"training_job": "nightly", "rank": "1", "path": "a/b"}
        assert daemon.value("batch_loss", **labels) == 0.75
        assert daemon.value("batch_examples_total", **labels) == 32
        assert daemon.value("fleetscope_push_group_last_push_timestamp_seconds", **labels) == clock.now

        pushadd_registry = CollectorRegistry()
        Gauge("eval_score", "Score.", registry=pushadd_registry).set(9)
        pushadd_to_gateway(
            gateway, job="nightly", registry=pushadd_registry, grouping_key={"rank": "1", "path": "a/b"}
        )
        assert daemon.value("batch_loss", **labels) == 0.75  # POST kept the other families
        assert daemon.value("eval_score", **labels) == 9

        push_to_gateway(gateway, job="other", registry=registry)
        delete_from_gateway(gateway, job="other")
        assert daemon.value("batch_loss", training_job="other") is None

        clock.now += 61
        assert daemon.value("batch_loss") is None
        assert daemon.value("fleetscope_push_groups") == 0
        assert daemon.value("fleetscope_push_expired_total", kind="group") == 1


def test_push_to_gateway_with_bad_body_raises_for_the_pusher() -> None:
    with running_daemon() as daemon:
        registry = CollectorRegistry()
        Gauge("fleetscope_fake", "Pretends to be ours.", registry=registry).set(1)
        with pytest.raises(urllib.error.HTTPError) as info:
            push_to_gateway(daemon.url.removeprefix("http://"), job="x", registry=registry)
        assert info.value.code == 400


def test_separate_push_address_keeps_pushes_off_the_metrics_port(tmp_path) -> None:
    ready = tmp_path / "ready.json"
    config = load(
        flags={
            "web.listen-address": "127.0.0.1:0",
            "push.listen-address": "127.0.0.1:0",
            "web.ready-file": str(ready),
            "log.level": "warning",
        },
        environ={},
    )
    daemon = build_daemon(config, collectors={"steps": StepsCollector(config)})
    assert daemon.push_app is not None
    thread = threading.Thread(target=asyncio.run, args=(daemon.serve(),), daemon=True)
    thread.start()
    try:
        body = json.dumps({"job": "sep", "rank": 0, "step": 1, "step_seconds": 1.0}).encode()

        bound = eventually(lambda: ready.exists() and json.loads(ready.read_text()), 60, "the daemon to listen")
        web, push = bound["main"], bound["push"]

        def post(address: str) -> int:
            request = urllib.request.Request(
                f"http://{address}/api/v1/steps",
                body,
                {"Content-Type": "application/json"},
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status
            except urllib.error.HTTPError as exc:
                return exc.code

        assert post(push) == 200  # both listeners are open once the ready file is written
        assert post(web) in (404, 405)
        with urllib.request.urlopen(f"http://{web}/metrics", timeout=10) as response:
            assert 'training_job="sep"' in response.read().decode()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://{push}/metrics", timeout=10)
    finally:
        daemon.request_stop()
        thread.join(15)
