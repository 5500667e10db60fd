"""Cross-origin access for browser frontends served from elsewhere: Starlette's CORS middleware
around the whole gateway when the config names origins, nothing at all when it names none (the
chat page is same-origin, and a request without CORS pays no per-request work).

Preflights are answered for GET and POST with the headers a chat client sends (Authorization
for API keys, Content-Type, the revisions opt-in header and W3C trace context); responses expose
Retry-After, so a browser client can honour a 429's delay. No cookies are involved: credentials
mode stays off, and `*` is allowed.
"""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from services.gateway.chat_endpoint import REVISIONS_HEADER

ALLOWED_METHODS = ("GET", "POST")
ALLOWED_HEADERS = ("authorization", "content-type", REVISIONS_HEADER, "traceparent", "tracestate")
EXPOSED_HEADERS = ("retry-after",)
PREFLIGHT_MAX_AGE_S = 600


def with_cors(app: ASGIApp, origins: tuple[str, ...]) -> ASGIApp:
    """`app` answering the given origins cross-origin; `app` itself when there are none."""
    if not origins:
        return app
    return CORSMiddleware(
        app,
        allow_origins=list(origins),
        allow_methods=list(ALLOWED_METHODS),
        allow_headers=list(ALLOWED_HEADERS),
        expose_headers=list(EXPOSED_HEADERS),
        max_age=PREFLIGHT_MAX_AGE_S,
    )
