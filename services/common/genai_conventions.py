"""The OpenTelemetry GenAI semantic conventions as tiermesh applies them: the provider and
operation names, the one model identity every service reports, and the attributes every GenAI
metric and span carries. Knows attribute names and values only; records nothing itself.

Model identity, end to end: `gen_ai.request.model` is the tier a call asks for (`small`,
`medium`, `large`: what the router routes to and calls, and what a tier is called by); the
gateway's is the OpenAI model name its client asked for (`tiermesh-routed`, `tiermesh-small`).
`gen_ai.response.model` is the model that answered, `<tier>/<model>` (`small/tier_small`), where
`<model>` is the name the tier's engine reports (TierStatus.model: the model folder's name, or its
parent's when the folder is called `model`). The tier sends it on its last chunk
(GenerateChunk.model), the router on Final.model; TierStatus.model_id carries it too.
"""

from __future__ import annotations

from typing import NamedTuple

PROVIDER = "tiermesh"  # gen_ai.provider.name: not one of the conventions' well-known providers
OPERATION = "chat"  # gen_ai.operation.name: every Generate and Chat call is a chat completion


class Histogram(NamedTuple):
    """A GenAI histogram's name and description, the same wherever it is created (one process
    may create it from several services, as the in-process test mesh does)."""

    name: str
    description: str


SERVER_DURATION = Histogram(
    "gen_ai.server.request.duration",
    "Requests served, from receipt to the last token or the failure",
)
CLIENT_DURATION = Histogram(
    "gen_ai.client.operation.duration",
    "Calls to a model service, from the call to its end (last token, failure or cancel)",
)


def model_id(tier: str, model: str) -> str:
    """The answering model's identity, `<tier>/<model>`; the tier alone if the model is unknown."""
    return f"{tier}/{model}" if model else tier


def span_name(request_model: str) -> str:
    """A GenAI span's name per the conventions: `{gen_ai.operation.name} {gen_ai.request.model}`."""
    return f"{OPERATION} {request_model}" if request_model else OPERATION


def genai_attributes(
    request_model: str, response_model: str = "", error_type: str = ""
) -> dict[str, str]:
    """The attributes every GenAI metric carries: operation and provider (required), the
    requested model (when known), the response model (when known) and `error.type` (the gRPC
    status name, or the exception's type, when the operation failed)."""
    attributes = {"gen_ai.operation.name": OPERATION, "gen_ai.provider.name": PROVIDER}
    if request_model:
        attributes["gen_ai.request.model"] = request_model
    if response_model:
        attributes["gen_ai.response.model"] = response_model
    if error_type:
        attributes["error.type"] = error_type
    return attributes


def error_type(status: str) -> str:
    """`error.type` for a call that ended with gRPC status `status`: its name, "" for OK."""
    return "" if status == "OK" else status
