"""API keys on a gRPC server: a grpc.aio interceptor that reads `authorization: Bearer <key>`,
checks the key, the scope the method needs and the key's rate limits, and makes the key
available to the handler (`current_api_key()`), so a handler can tie state to it (Feedback
only from the key that made the request).

Refusals carry google.rpc details: UNAUTHENTICATED and PERMISSION_DENIED an ErrorInfo reason,
RESOURCE_EXHAUSTED a RetryInfo with the delay. Health checks stay open (orchestrators probe
without keys). Tokens a chat used (its final event's usage) count against the key's tokens per
minute when the stream ends.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from tiermesh.v1 import router_pb2

from services.common.errors import PermissionDenied, Unauthenticated
from services.common.status_details import abort_with_details
from services.security.api_keys import ApiKey, KeyRing, RateLimited
from services.security.guarded_handlers import guard_handler

_CURRENT: contextvars.ContextVar[ApiKey | None] = contextvars.ContextVar(
    "tiermesh_api_key", default=None
)
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
# What each method needs; a method not listed needs "admin" (reflection, admin services).
ROUTER_SCOPES: Mapping[str, str] = {
    "/tiermesh.v1.RouterService/Chat": "chat",
    "/tiermesh.v1.RouterService/Feedback": "feedback",
}


def current_api_key() -> ApiKey | None:
    """The key of the call being handled (None when keys are off)."""
    return _CURRENT.get()


def bearer_token(metadata: Any) -> str | None:
    """The token of an `authorization: Bearer ...` header, if any."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def _final_tokens(message: Any) -> int:
    """Prompt plus completion tokens of a ChatEvent's Final (0 for any other message: a tier's
    hot swap progress, the mesh's status)."""
    if not isinstance(message, router_pb2.ChatEvent) or message.WhichOneof("event") != "final":
        return 0
    return sum(u.usage.prompt_tokens + u.usage.completion_tokens for u in message.final.usage)


class ApiKeyAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks every call but health (and methods under `open_prefixes`, which another check
    guards) against `ring`, with the scope `scopes` names for its method ("admin" for any
    other)."""

    def __init__(
        self,
        ring: KeyRing,
        scopes: Mapping[str, str] = ROUTER_SCOPES,
        open_prefixes: tuple[str, ...] = (),
    ) -> None:
        self.ring = ring
        self.scopes = scopes
        self.open = (*OPEN_PREFIXES, *open_prefixes)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or method.startswith(self.open):
            return handler
        return self._guard(handler, method, self.scopes.get(method, "admin"))

    async def _admit(self, context: Any, method: str, scope: str) -> ApiKey | None:
        """The caller's key, or None after aborting the call with why it was refused."""
        try:
            key = self.ring.authenticate(bearer_token(context.invocation_metadata()))
            self.ring.authorize(key, scope)
            self.ring.admit(key)
        except Unauthenticated as e:
            await abort_with_details(
                context, grpc.StatusCode.UNAUTHENTICATED, str(e), reason="API_KEY_INVALID"
            )
        except PermissionDenied as e:
            await abort_with_details(
                context, grpc.StatusCode.PERMISSION_DENIED, str(e), reason="SCOPE_MISSING"
            )
        except RateLimited as e:
            await abort_with_details(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                str(e),
                reason="RATE_LIMITED",
                retry_after_s=e.retry_after_s,
            )
        else:
            return key
        return None

    def _guard(self, handler: Any, method: str, scope: str) -> Any:
        async def check(context: Any) -> ApiKey | None:
            key = await self._admit(context, method, scope)
            _CURRENT.set(key)
            return key

        def charge(key: ApiKey | None, message: Any) -> None:
            if key is not None and (tokens := _final_tokens(message)):
                self.ring.charge(key, tokens)

        return guard_handler(handler, check, charge)
