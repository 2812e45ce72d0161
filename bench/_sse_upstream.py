"""The fast SSE upstream of ``bench/exporters.py`` with OpenAI's ``"object": "text_completion"``
on every chunk, which AIPerf's completions parser needs to read a chunk's text (it ignores
chunks of an unnamed object type). Own process, until SIGTERM:
``python bench/_sse_upstream.py PORT TOKENS GAP_S``. See docs/gateway.md#measured-against-aiperf.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from exporters import _chunk, _new_loop, _UpstreamProto  # noqa: E402


class OpenAIUpstream(_UpstreamProto):
    """The same stream, chunk for chunk, each chunk naming its object type."""

    def __init__(self, tokens: int, gap_s: float) -> None:
        super().__init__(tokens, gap_s)
        head = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":'
        tok = _chunk(head + b'null}]}\n\n')
        last = _chunk(head + b'"length"}],"usage":{"prompt_tokens":4,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                      % (tokens, tokens + 4))
        self.parts = [self.HEAD + tok] + [tok] * (tokens - 2) + [last + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"]


def serve(port: int, tokens: int, gap_s: float) -> None:
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(loop.create_server(lambda: OpenAIUpstream(tokens, gap_s), "127.0.0.1", port,
                                                        backlog=1024))
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.run_until_complete(stop.wait())
    server.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
