"""Cross-origin access for browser frontends served from elsewhere: Starlette's CORS middleware
around the whole gateway when the config names origins, nothing at all when it names none (the
chat page is same-origin, and a request without CORS pays no per-request work).

Preflights are answered for GET and POST with whatever request headers the page asks for:
OpenAI's own JavaScript SDK sends its `x-stainless-*` headers on every call besides
Authorization (API keys), Content-Type, the revisions opt-in header and trace context, and a
list would refuse its preflight. That is safe because no cookies are involved: credentials mode
stays off (and `*` as an origin is allowed). Responses expose Retry-After, so a browser client
can honour a 429's delay.
"""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

ALLOWED_METHODS = ("GET", "POST")
ALLOWED_HEADERS = ("*",)  # echoes the preflight's Access-Control-Request-Headers
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
