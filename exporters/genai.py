"""The OpenTelemetry GenAI semantic conventions, as llmsla's spans and OTLP metrics use them.

Every convention name (``gen_ai.*``, ``server.*``, ``error.type``, the ``gen_ai`` metric names,
units and descriptions) is imported here from the ``opentelemetry-semantic-conventions``
package, once, so no module retypes one and a rename upstream is an ImportError here rather
than a silently empty panel in Tempo or Grafana. What the package does not define (the span
name format, the provider value, the token-usage bounds, our ``llmsla.*`` attributes) is in
``llmsla.names``. llmsla follows semantic conventions 1.41.1 (``SCHEMA_URL``); the names used
here (``gen_ai.request.stream``, ``gen_ai.response.time_to_first_chunk`` the newest) are all in
the package's releases that know schema 1.41.1; pyproject pins the range.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _ga
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as _gm
from opentelemetry.semconv.attributes import error_attributes as _err
from opentelemetry.semconv.attributes import server_attributes as _srv
from opentelemetry.semconv.schemas import Schemas

from llmsla import names
from llmsla.events import string_problem
from llmsla.exporters.openai import CHAT_COMPLETIONS

# -- attribute keys ------------------------------------------------------------------------------
OPERATION_NAME = _ga.GEN_AI_OPERATION_NAME
PROVIDER_NAME = _ga.GEN_AI_PROVIDER_NAME
REQUEST_MODEL = _ga.GEN_AI_REQUEST_MODEL
REQUEST_TEMPERATURE = _ga.GEN_AI_REQUEST_TEMPERATURE
REQUEST_MAX_TOKENS = _ga.GEN_AI_REQUEST_MAX_TOKENS
REQUEST_SEED = _ga.GEN_AI_REQUEST_SEED
REQUEST_TOP_P = _ga.GEN_AI_REQUEST_TOP_P
REQUEST_TOP_K = _ga.GEN_AI_REQUEST_TOP_K
REQUEST_FREQUENCY_PENALTY = _ga.GEN_AI_REQUEST_FREQUENCY_PENALTY
REQUEST_PRESENCE_PENALTY = _ga.GEN_AI_REQUEST_PRESENCE_PENALTY
REQUEST_STOP_SEQUENCES = _ga.GEN_AI_REQUEST_STOP_SEQUENCES
REQUEST_CHOICE_COUNT = _ga.GEN_AI_REQUEST_CHOICE_COUNT
REQUEST_STREAM = _ga.GEN_AI_REQUEST_STREAM
RESPONSE_TIME_TO_FIRST_CHUNK = _ga.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK
CONVERSATION_ID = _ga.GEN_AI_CONVERSATION_ID
RESPONSE_MODEL = _ga.GEN_AI_RESPONSE_MODEL
RESPONSE_ID = _ga.GEN_AI_RESPONSE_ID
RESPONSE_FINISH_REASONS = _ga.GEN_AI_RESPONSE_FINISH_REASONS
USAGE_INPUT_TOKENS = _ga.GEN_AI_USAGE_INPUT_TOKENS
USAGE_OUTPUT_TOKENS = _ga.GEN_AI_USAGE_OUTPUT_TOKENS
TOKEN_TYPE = _ga.GEN_AI_TOKEN_TYPE
SERVER_ADDRESS = _srv.SERVER_ADDRESS
SERVER_PORT = _srv.SERVER_PORT
ERROR_TYPE = _err.ERROR_TYPE

# -- attribute values ----------------------------------------------------------------------------
CHAT = _ga.GenAiOperationNameValues.CHAT.value
TEXT_COMPLETION = _ga.GenAiOperationNameValues.TEXT_COMPLETION.value
TOKEN_INPUT = _ga.GenAiTokenTypeValues.INPUT.value
TOKEN_OUTPUT = _ga.GenAiTokenTypeValues.OUTPUT.value

#: The conventions version our telemetry follows (the scope's schema URL): 1.41.1, the last release
#: of open-telemetry/semantic-conventions that holds the GenAI conventions (docs/opentelemetry.md).
SCHEMA_URL = Schemas.V1_41_1.value
#: Longest stop sequence list / sequence reported on a span (the request's own bounds are the
#: replica's business; a span attribute must stay small).
MAX_STOP_SEQUENCES = 16



def operation(path: str) -> str:
    """``gen_ai.operation.name`` of an OpenAI request path (the gateway and the worker serve the
    same two: chat completions and the legacy completions)."""
    return CHAT if path == CHAT_COMPLETIONS else TEXT_COMPLETION


def span_name(op: str, model: str) -> str:
    """The conventions' span name, ``{gen_ai.operation.name} {gen_ai.request.model}`` (the
    operation alone when the model is unknown)."""
    return names.GENAI_SPAN_NAME.format(operation=op, model=model) if model else op


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def request_attributes(op: str, body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The request-side ``gen_ai.*`` attributes of an OpenAI body: operation, provider, model and
    the sampling parameters the client set (absent or mistyped ones are left out, as the
    conventions ask), ``gen_ai.request.stream`` on a streamed request (the conventions: if and only
    if it streams; unset reads as not streaming), the choice count when not 1."""
    attrs: dict[str, Any] = {OPERATION_NAME: op, PROVIDER_NAME: names.GENAI_PROVIDER, REQUEST_MODEL: model}
    for key, attr in (("temperature", REQUEST_TEMPERATURE), ("top_p", REQUEST_TOP_P),
                      ("frequency_penalty", REQUEST_FREQUENCY_PENALTY),
                      ("presence_penalty", REQUEST_PRESENCE_PENALTY)):
        value = body.get(key)
        if _number(value):
            attrs[attr] = float(value)
    top_k = body.get("top_k")  # vLLM's extension of the OpenAI body
    if _number(top_k):
        attrs[REQUEST_TOP_K] = float(top_k)
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    stops = [s[:256] for s in stops[:MAX_STOP_SEQUENCES] if isinstance(s, str)]
    if stops and all(string_problem(s) is None for s in stops):
        attrs[REQUEST_STOP_SEQUENCES] = tuple(stops)
    n = body.get("n")
    if _int(n) and n != 1:
        attrs[REQUEST_CHOICE_COUNT] = n
    if body.get("stream") is True:
        attrs[REQUEST_STREAM] = True
    max_tokens = body.get("max_completion_tokens") if op == CHAT else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if _int(max_tokens):
        attrs[REQUEST_MAX_TOKENS] = max_tokens
    seed = body.get("seed")
    if _int(seed):
        attrs[REQUEST_SEED] = seed
    return attrs


def conversation_id(headers: Mapping[str, str]) -> str | None:
    """``gen_ai.conversation.id``: the session the client named (``names.UNIT_HEADER``, the same
    header the student split and A/B buckets read), when it is a storable string."""
    value = headers.get(names.UNIT_HEADER)
    if value is None:
        value = headers.get(names.UNIT_HEADER.lower())
    if not value or len(value) > 256 or string_problem(value) is not None:
        return None
    return value


def server_of(url: str) -> tuple[str, int]:
    """``(server.address, server.port)`` of a base URL (the scheme's default port if none)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


# -- metric instruments --------------------------------------------------------------------------
class _Spec:
    """Stands in for a Meter to read name, unit and description out of the package's instrument
    factories (``create_gen_ai_*``), so those come from the conventions too."""

    def create_histogram(self, name: str, unit: str = "", description: str = "", **_: Any) -> tuple[str, str, str]:
        return name, unit, description


def instrument(factory: Callable[[Any], Any]) -> tuple[str, str, str]:
    """``(name, unit, description)`` of a ``gen_ai_metrics.create_*`` histogram."""
    return factory(_Spec())


TIME_TO_FIRST_TOKEN = instrument(_gm.create_gen_ai_server_time_to_first_token)
TIME_PER_OUTPUT_TOKEN = instrument(_gm.create_gen_ai_server_time_per_output_token)
REQUEST_DURATION = instrument(_gm.create_gen_ai_server_request_duration)
TOKEN_USAGE = instrument(_gm.create_gen_ai_client_token_usage)
#: Required of an instrumentation that reports GenAI client metrics: the gateway is the replica's
#: client (the CLIENT span of the hop), and this is that span's duration.
CLIENT_DURATION = instrument(_gm.create_gen_ai_client_operation_duration)
#: The advised explicit bucket boundaries of each (``names.GENAI_*_BUCKETS``, from the v1.41.1 docs).
ADVISED_BOUNDS: dict[str, tuple[float, ...]] = {
    TIME_TO_FIRST_TOKEN[0]: names.GENAI_TTFT_BUCKETS,
    TIME_PER_OUTPUT_TOKEN[0]: names.GENAI_TPOT_BUCKETS,
    REQUEST_DURATION[0]: names.GENAI_DURATION_BUCKETS,
    TOKEN_USAGE[0]: names.TOKEN_USAGE_BUCKETS,
    CLIENT_DURATION[0]: names.GENAI_DURATION_BUCKETS,
}
