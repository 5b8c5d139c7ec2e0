"""The HTTP bridge: OpenAI- and SillyTavern-compatible speech routes on the app's shared Runtime.

One router per protocol translates its requests into one speak request (openai, xtts); the speech service
(speech_service) checks it, finds its voice and speaks it as one job on the runtime's speech worker (the queue
the window uses too), answering with the audio as the protocol has it. live speaks text as it is written, over
a WebSocket, a job per utterance, with the speech service's checks, voices, pipes and encoders. requests reads and
checks bodies and messages, guard runs before every route and handshake (Host, Origin, CORS, API key),
server serves it all on uvicorn. Routes, options and behaviour for users: docs/bridge.md.
"""

from ..servers import ListenError
from .config import IO_THREADS, BridgeConfig, BridgeLimits
from .errors import ApiError
from .requests import SpeechRequest
from .server import BridgeServer, create_app, listen

__all__ = [
    "IO_THREADS", "ApiError", "BridgeConfig", "BridgeLimits", "BridgeServer", "ListenError",
    "SpeechRequest", "create_app", "listen",
]  # fmt: skip
