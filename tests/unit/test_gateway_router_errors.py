"""The gateway's HTTP error for a router status that carries google.rpc details: Retry-After from
RetryInfo, `param` from BadRequest."""

from __future__ import annotations

import grpc
from grpc.aio import AioRpcError, Metadata

from services.common.status_details import rich_status
from services.gateway.router_chat import RouterChat


class FakeRouterStub:
    """Stands in for the router's stub: RouterChat only starts a call in its constructor."""

    class _Call:
        def cancel(self) -> bool:
            return True

    def Chat(self, *args: object, **kwargs: object) -> _Call:
        return self._Call()


def rpc_error(status: grpc.Status) -> AioRpcError:
    return AioRpcError(status.code, Metadata(), Metadata(*status.trailing_metadata), status.details)


def error_for(status: grpc.Status) -> object:
    chat = RouterChat(FakeRouterStub(), None, [], 1.0, retry_after_s=1)  # type: ignore[arg-type]
    return chat._error(rpc_error(status))


def test_retry_info_becomes_retry_after_in_whole_seconds() -> None:
    status = rich_status(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "key over its limit", retry_after_s=2.2
    )
    error = error_for(status)
    assert error.status == 429
    assert error.headers() == {"Retry-After": "3"}
    assert error.body()["error"]["message"] == "key over its limit"


def test_bad_request_details_name_the_param() -> None:
    status = rich_status(
        grpc.StatusCode.INVALID_ARGUMENT, "must be in [0, 2]", field="sampling.temperature"
    )
    error = error_for(status)
    assert (error.status, error.param) == (400, "temperature")


def test_an_indexed_field_names_its_openai_param() -> None:
    status = rich_status(
        grpc.StatusCode.INVALID_ARGUMENT, "must be 1 to 128 characters", field="sampling.stop[1]"
    )
    assert error_for(status).param == "stop"
