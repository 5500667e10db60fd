"""The errors tiermesh raises, each tied to the gRPC status a caller sees for it.

    TiermeshError
     ├── InvalidArgument   INVALID_ARGUMENT    the request is wrong; the caller must fix it
     │    └── PromptTooLong                    longer than this tier holds; another may hold it
     ├── Overloaded        RESOURCE_EXHAUSTED  recoverable: retry later or elsewhere
     ├── Unavailable       UNAVAILABLE         recoverable: the tier is down, loading or draining
     ├── Unauthenticated   UNAUTHENTICATED     no API key, or one that is unknown or revoked
     ├── PermissionDenied  PERMISSION_DENIED   a known caller asked for what it may not do
     └── ConfigError       (start-up only)     unrecoverable: a config file or flag is wrong

Knows nothing of grpc: status codes are named by string, and the servers translate them.
"""

from __future__ import annotations


class TiermeshError(Exception):
    """Base of every error tiermesh raises on purpose."""

    status = "INTERNAL"


class InvalidArgument(TiermeshError):
    """The request is malformed; the message names the field and what was wrong."""

    status = "INVALID_ARGUMENT"


# ErrorInfo reason of a prompt longer than a tier's model can hold: another tier's may
PROMPT_TOO_LONG = "PROMPT_TOO_LONG"


class PromptTooLong(InvalidArgument):
    """The prompt has more tokens than this tier takes (its limit, within its model's context).
    The router moves such a chat on to a tier that may hold it; the ErrorInfo metadata carries
    `prompt_tokens` and `limit_tokens`."""

    reason = PROMPT_TOO_LONG

    def __init__(self, prompt_tokens: int, limit_tokens: int) -> None:
        super().__init__(
            f"prompt: {prompt_tokens} tokens exceeds this tier's limit of {limit_tokens} tokens"
        )
        self.metadata = {"prompt_tokens": str(prompt_tokens), "limit_tokens": str(limit_tokens)}


class Overloaded(TiermeshError):
    """Admission refused because a bounded queue is full. Recoverable: retry later."""

    status = "RESOURCE_EXHAUSTED"


# ErrorInfo reasons of an overload refusal: at capacity for any caller, or refused only for the
# request's own deadline, too short for the expected wait (a longer one would have been queued)
AT_CAPACITY = "OVERLOADED"
WAIT_PAST_DEADLINE = "WAIT_PAST_DEADLINE"


class Unavailable(TiermeshError):
    """The service cannot take work now (loading, draining, shut down). Recoverable."""

    status = "UNAVAILABLE"


class Unauthenticated(TiermeshError):
    """The caller did not prove who it is (no API key, or an unknown or revoked one)."""

    status = "UNAUTHENTICATED"


class PermissionDenied(TiermeshError):
    """The caller is known but may not do this (a scope it lacks, another key's request)."""

    status = "PERMISSION_DENIED"


class ConfigError(TiermeshError):
    """A configuration value is wrong; the message names the file and field. Unrecoverable."""
