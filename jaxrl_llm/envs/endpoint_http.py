"""The HTTP side of the OpenAI-compatible endpoint (envs/endpoint.py `AgentEnvironment`): a threaded server on
localhost and one `EpisodeChannel` per agent episode, through which each request waits for the model's reply.

Routes: `POST /ep/<episode>/v1/chat/completions` (each agent's base URL), and `POST /v1/chat/completions`
with a `SESSION_HEADER` the environment registered for an episode (`EndpointServer.aliases`): one base URL
for every episode, for clients that keep one connection pool per URL (envs/verifiers_env.py).
"""
from __future__ import annotations

import http.server
import json
import queue
import threading
import time
from typing import Any

from jaxrl_llm.envs.base import EpisodeFailed

MAX_BODY = 16 << 20  # bytes of one request
SESSION_HEADER = "X-Session-ID"  # names the episode of a request to the shared route /v1/chat/completions


class EpisodeChannel:
    """One agent episode: the agent's thread, its queue of events (requests, its return) and the
    conversation as the agent must send it back."""

    def __init__(self, key: str, timeout_s: float):
        self.key, self.timeout_s = key, timeout_s
        self.events: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.closed = False
        self.pending: queue.Queue | None = None  # the reply slot of the request waiting for the model
        self.sent: list[dict] = []  # the conversation: the agent's messages and our assistant replies
        self.replies: list[tuple[str, dict]] = []  # per turn: (raw turn text, the assistant message sent)
        self.tools: list | None = None
        self.used_s = 0.0  # time the agent held its turns
        self.result: tuple[str, Any] | None = None  # ("return", value) or ("raise", exception), once ended
        self.turns = 0
        self.server: EndpointServer | None = None

    # -- from HTTP handler threads --
    def submit(self, body: Any) -> tuple[int, dict]:
        slot: queue.Queue = queue.Queue(1)
        with self.lock:
            if self.closed:
                return 400, error_body("episode_over", "this episode is over (its turn limit or token budget is "
                                                   "spent, or it failed): return the reward")
            self.events.put(("request", body, slot))
        return slot.get()

    # -- from the environment's threads --
    def wait(self) -> tuple[str, Any, Any]:
        """The agent's next event, within what is left of its time; EpisodeFailed('timeout') past it."""
        start = time.perf_counter()
        try:
            event = self.events.get(timeout=max(self.timeout_s - self.used_s, 0.0))
        except queue.Empty:
            raise EpisodeFailed("timeout", f"the agent ran past its {self.timeout_s:g} s") from None
        finally:
            self.used_s += time.perf_counter() - start
        if event[0] == "request":
            return event
        self.result = event[:2]
        return (*event[:2], None)

    def answer(self, code: int, payload: dict) -> None:
        if self.pending is not None:
            self.pending.put((code, payload))
            self.pending = None

    def close(self, code: int = 400, payload: dict | None = None) -> None:
        """Ends the episode for the agent: the pending request gets (code, payload), every later one 400."""
        over = error_body("episode_over", "this episode is over: return the reward")
        with self.lock:
            self.closed = True
            self.answer(code, payload or over)
            while True:
                try:
                    event = self.events.get_nowait()
                except queue.Empty:
                    break
                if event[0] == "request":
                    event[2].put((400, over))
                elif self.result is None:
                    self.result = event[:2]


def error_body(code: str, message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall per reply
    server: "EndpointServer"

    def log_message(self, *args):  # no stderr line per request
        pass

    def _reply(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on the request (its timeout)
            self.close_connection = True

    def do_GET(self):  # noqa: N802 - http.server's name
        self._reply(404, error_body("not_found", f"no route GET {self.path}"))

    def do_POST(self):  # noqa: N802
        if not self.server.alive:  # a stopped server drops its kept-alive connections too
            self.close_connection = True
            return
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts == ["v1", "chat", "completions"]:  # the shared route: the session header names the episode
            parts = ["ep", self.server.aliases.get(self.headers.get(SESSION_HEADER, ""), ""), *parts]
        episode = self.server.episodes.get(parts[1]) if len(parts) == 5 and parts[0] == "ep" else None
        if episode is None or parts[2:] != ["v1", "chat", "completions"]:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(min(length, MAX_BODY))
            return self._reply(404, error_body("not_found", f"no episode or route at {self.path} (only "
                                                        "/ep/<episode>/v1/chat/completions is served, and "
                                                        f"/v1/chat/completions with a known {SESSION_HEADER})"))
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            episode.events.put(("request", None, queue.Queue(1)))  # fails the episode as a bad request
            self.close_connection = True
            return self._reply(413, error_body("too_large", f"request body over {MAX_BODY} bytes"))
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except (ValueError, UnicodeDecodeError):
            body = None  # malformed JSON: refused by the episode's check, which fails it
        self._reply(*episode.submit(body))


class EndpointServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # The listen backlog: every agent of a batch may connect at once while the trainer's thread holds the
    # interpreter (compiling); past socketserver's 5 the kernel drops their SYNs and retries them seconds later.
    request_queue_size = 1024

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.episodes: dict[str, EpisodeChannel] = {}
        self.aliases: dict[str, str] = {}  # SESSION_HEADER value -> episode key (envs/verifiers_env.py)
        self.alive = True
        self.thread = threading.Thread(target=self.serve_forever, name="jaxrl-endpoint", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.alive = False
        self.shutdown()
        self.server_close()
