"""Wraps a grpc.aio method handler so a check runs before the handler and, for server streams,
an observer sees each response: what the caller check (tls.AllowedCallers) and the API key check
(api_key_auth.ApiKeyAuth) share. The check aborts the call itself (context.abort) to refuse it.
Knows nothing of what is checked."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

Check = Callable[[Any], Awaitable[Any]]  # (context) -> a value handed to the observer
Observer = Callable[[Any, Any], None]  # (the check's value, a response message)


def guard_handler(handler: Any, check: Check, observe: Observer | None = None) -> Any:
    """`handler` with `check(context)` run first; `observe(value, message)` sees each message a
    server stream yields. Client-streaming handlers (none in tiermesh) are returned as they are."""
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            await check(context)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream is not None:
        stream = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> Any:
            value = await check(context)
            if not inspect.isasyncgenfunction(stream):  # writes with context.write()
                await stream(request, context)
                return
            async for message in stream(request, context):
                if observe is not None:
                    observe(value, message)
                yield message

        return grpc.unary_stream_rpc_method_handler(
            unary_stream, handler.request_deserializer, handler.response_serializer
        )
    if handler.stream_stream is not None:  # server reflection
        bidi = handler.stream_stream

        async def stream_stream(requests: Any, context: Any) -> Any:
            await check(context)
            async for message in bidi(requests, context):
                yield message

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, handler.request_deserializer, handler.response_serializer
        )
    return handler
