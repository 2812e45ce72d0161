"""The receiver's HTTP plumbing: bearer auth, bounded JSON bodies, JSON error bodies.

Small functions on purpose: they are meant to move into the shared HTTP kit when it lands, and
the receiver then only swaps imports. Every error is ``{"error": reason}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import hmac

from aiohttp import web


class HttpError(Exception):
    def __init__(self, status: int, reason: str, **headers: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers


def error_response(status: int, reason: str, **headers: str) -> web.Response:
    return web.json_response({"error": reason}, status=status, headers=headers or None)


def check_bearer(request: web.Request, token: str, *, setting: str) -> None:
    """401 without a valid ``Authorization: Bearer``; compared in constant time.

    An empty configured token refuses everything (503) instead of leaving the endpoint open.
    """
    if not token:
        raise HttpError(503, f"writes are disabled: {setting} is empty (set it, or its LLMSLA_* variable)")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise HttpError(401, "missing bearer token: send 'Authorization: Bearer <token>'", **{"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise HttpError(401, "invalid bearer token", **{"WWW-Authenticate": "Bearer"})


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, or 413 as soon as it passes ``limit`` bytes (declared or streamed)."""
    if request.content_length is not None and request.content_length > limit:
        raise HttpError(413, f"body of {request.content_length} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@web.middleware
async def json_errors(request: web.Request, handler: web.Handler) -> web.StreamResponse:
    """aiohttp's own 404/405/413 answers become JSON errors with a reason too."""
    try:
        return await handler(request)
    except HttpError as exc:
        return error_response(exc.status, exc.reason, **exc.headers)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error_response(exc.status, exc.reason or exc.text or "error",
                                  **{k: v for k, v in exc.headers.items() if k in ("Allow",)})
        raise
