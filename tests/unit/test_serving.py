"""Waiting for a gRPC server's health to say SERVING (services.common.serving), against a real
in-process server on port 0: what one check sees, a wait that ends when the status flips, and
the errors that name the target and its last answer (time up, or the process exited first)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.ports import free_port
from services.common.serving import (
    NotServingError,
    health_status,
    is_serving,
    wait_serving,
    wait_serving_async,
)

Status = health_pb2.HealthCheckResponse


@pytest.fixture
def server() -> Iterator[tuple[str, health.HealthServicer]]:
    """A server whose health says NOT_SERVING until the test sets it."""
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    servicer.set("", Status.NOT_SERVING)
    grpc_server.start()
    yield f"127.0.0.1:{port}", servicer
    grpc_server.stop(0)


def test_one_check_says_what_the_server_answers(
    server: tuple[str, health.HealthServicer],
) -> None:
    target, servicer = server
    assert health_status(target) == "NOT_SERVING" and not is_serving(target)
    servicer.set("", Status.SERVING)
    assert health_status(target) == "SERVING" and is_serving(target)
    assert health_status(target, service="nobody").startswith("NOT_FOUND: ")
    assert health_status(f"127.0.0.1:{free_port()}").startswith("UNAVAILABLE: ")


def test_a_wait_ends_when_the_server_says_serving(
    server: tuple[str, health.HealthServicer],
) -> None:
    target, servicer = server
    threading.Timer(0.3, servicer.set, ("", Status.SERVING)).start()
    wait_serving(target, 10, interval_s=0.05)
    assert is_serving(target)


def test_time_up_names_the_target_and_its_last_answer(
    server: tuple[str, health.HealthServicer],
) -> None:
    target, _ = server
    with pytest.raises(NotServingError) as raised:
        wait_serving(target, 0.3, interval_s=0.05, name="small")
    assert str(raised.value) == (
        f"small ({target}): not SERVING within 0.3 s (health last answered: NOT_SERVING)"
    )
    assert raised.value.exit_code is None and raised.value.seen == "NOT_SERVING"


async def test_an_exited_process_ends_the_wait_at_once() -> None:
    target = f"127.0.0.1:{free_port()}"  # nothing listens: the process behind it died
    with pytest.raises(NotServingError) as raised:
        await wait_serving_async(target, 60, exited=lambda: 3)
    assert str(raised.value).startswith(
        f"{target}: exited with code 3 before it was SERVING (health last answered: UNAVAILABLE"
    )
    assert raised.value.exit_code == 3


async def test_the_async_wait_ends_when_the_server_says_serving(
    server: tuple[str, health.HealthServicer],
) -> None:
    target, servicer = server
    threading.Timer(0.3, servicer.set, ("", Status.SERVING)).start()
    await wait_serving_async(target, 10, interval_s=0.05, exited=lambda: None)
    assert is_serving(target)
