"""An OpenAI-compatible endpoint over the policy, for agents written against the `openai` package
(docs/environments.md, "Agents over the endpoint").

An agent is a Python function `agent(client, task) -> reward`: `client` an `openai.OpenAI` client whose
base URL is this episode's path on a local HTTP server (127.0.0.1, a free port), `task` the dataset row
(its columns). Each episode is one rollout row; its agent runs in a thread of its own. The environment
(`AgentEnvironment`, `env.name=agent`) turns the agent's requests into the turns of that row:

  reset(row)   starts the agent and waits for its first `POST .../v1/chat/completions`: its messages
               (and tools) are the episode's prompt.
  step(turn)   answers the pending request with the model's turn (tool calls parsed as
               envs/toolcalls.py does), then waits for the agent's next request: its messages must be
               the conversation so far (the messages the agent sent, the assistant replies it got) plus
               new `user`/`tool`/`system` messages, which are the observation; or for the agent's return:
               the episode ends, the return value is its reward.
  end(state)   after the episode (the agent returned, or the turn limit or token budget ended it): a
               request still pending gets an empty reply with `finish_reason: "length"` (any later one an
               HTTP 400 `episode_over`), and the agent's return value is the reward.
  abort(state) the runner failed the episode (the chat template cannot render the agent's messages): the
               pending request gets an HTTP 400 saying so.

Token-in-token-out holds as for every environment: the runner keeps the ids the model drew and prefills
only the observation's ids; the agent's copy of the conversation is checked against the server's, never
re-encoded. A request that does not extend the conversation (history rewritten, a forged assistant
message, two requests at once) is refused (HTTP 400) and fails the episode: a row's KV cache holds one
conversation. The request's sampling options (temperature, max_tokens, ...) are ignored: the policy
samples as the trainer's config says; `n > 1` and `stream` are refused.

Faults end the episode, never the run: `EpisodeFailed` with one of the statuses envs/base.py lists
(counted as `env/failed/<status>_frac`): `agent_error` (the agent raised, or returned before any request),
`timeout` (the agent held its turns longer than `timeout_s` in all, waiting for the model not counted),
`bad_reward`, `bad_request`, `disconnected` (the agent failed while the endpoint was not serving).
A thread cannot be killed: an agent past its timeout is abandoned (its later requests get HTTP 400).
An agent that raises `EpisodeFailed(status, message)` names its episode's status itself.

Routes: `POST /ep/<episode>/v1/chat/completions` (each agent's base URL), and `POST /v1/chat/completions`
with an `X-Session-ID` header the environment registered for an episode (`EndpointServer.aliases`): one base
URL for every episode, for clients that keep one connection pool per URL (envs/verifiers_env.py).
"""
from __future__ import annotations

import importlib.util
import json
import math
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable

from jaxrl_llm.envs.base import Environment, EpisodeFailed, StepResult
from jaxrl_llm.envs.registry import import_object, register_env
from jaxrl_llm.envs.endpoint_http import EndpointServer, EpisodeChannel, error_body
from jaxrl_llm.envs.toolcalls import parse_tool_calls

_OBSERVATION_ROLES = ("user", "tool", "system")


def _text(content: Any, where: str) -> str:
    """A message content as text: a string, None (''), or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise EpisodeFailed("bad_request", f"{where}: content must be a text or a list of text parts, "
                                       f"got {content!r:.60}")


def _message(m: Any, where: str) -> dict:
    if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
        raise EpisodeFailed("bad_request", f"{where} is not a message with a string 'role': {m!r:.60}")
    out = {"role": m["role"], "content": _text(m.get("content"), where)}
    for k in ("name", "tool_call_id"):
        if isinstance(m.get(k), str):
            out[k] = m[k]
    return out


def _calls_of(m: Mapping) -> list[tuple[str, Any]]:
    out = []
    for c in m.get("tool_calls") or []:
        f = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(f, Mapping):
            raise EpisodeFailed("bad_request", f"a tool call without 'function': {c!r:.60}")
        args = f.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass
        out.append((f.get("name"), args))
    return out


@register_env("agent")
class AgentEnvironment(Environment):
    """`env.name=agent`: each episode runs `agent(client, task) -> reward` against the endpoint.

    agent: the function, or its import path 'package.module:function'.
    timeout_s: the most time one episode's agent may hold its turns, in all (the model's time not counted).
    client: 'openai' (an `openai.OpenAI` client, max_retries=0) or 'url' (the base URL, a string, for
      agents that build their own client).
    chat: True: the messages go through the model's chat template (its turn ends, tool calls). False (a
      model without chat template, like the built-in tiny one): the prompt is the first request's message
      contents joined, each observation the new messages' contents joined, as text; no tools.
    """

    def __init__(self, agent: str | Callable[..., Any], timeout_s: float = 60.0, client: str = "openai",
                 chat: bool = True):
        if client not in ("openai", "url"):
            raise ValueError(f"env.kwargs.client must be 'openai' or 'url', got {client!r}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"env.kwargs.timeout_s must be a number > 0, got {timeout_s!r}")
        if isinstance(agent, str):
            try:
                agent = import_object(agent)
            except ValueError as e:
                missing = str(e).split("No module named ")[-1].strip("'\"") if "No module named" in str(e) else ""
                hint = f" (pip install {missing.split('.')[0]})" if missing else ""
                raise ValueError(f"env.kwargs.agent: {e}{hint}".replace("environment ", "agent ", 1)) from None
        if not callable(agent):
            raise ValueError(f"env.kwargs.agent must be a function agent(client, task), got {agent!r:.60}")
        if client == "openai":
            if importlib.util.find_spec("openai") is None:  # imported lazily, by reset
                raise ValueError("env.name=agent with client='openai' needs the openai package: "
                                 "pip install openai (or env.kwargs.client='url')")
        self.agent, self.timeout_s, self.client, self.chat = agent, float(timeout_s), client, bool(chat)
        self._server: EndpointServer | None = None
        self._tools: list | None = None
        self._tools_set = False
        self._http_client = None
        self._lock = threading.Lock()

    # -- the server --
    def _serve(self) -> EndpointServer:
        with self._lock:
            if self._server is None or not self._server.alive:  # (re)started: a dead server does not stop the run
                self._server = EndpointServer()
            return self._server

    def _http(self):
        """One httpx client for every episode's `openai.OpenAI` (building one per client costs a TLS
        context, about 0.25 s): a pool without limits, as every waiting agent holds a connection."""
        with self._lock:
            if self._http_client is None:
                import openai._base_client as openai_http  # openai's own HTTP library: httpx2 from openai 3
                httpx = getattr(openai_http, "httpx2", None) or openai_http.httpx  # on, httpx before (both may
                # be installed: verifiers requires httpx2 and openai 2)
                # TCP_NODELAY: httpx writes a request's headers and body apart; with Nagle the body waits
                # for the server's delayed ACK of the headers (40 ms a request on Linux).
                transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
                                                limits=httpx.Limits(max_connections=None,
                                                                    max_keepalive_connections=None))
                self._http_client = httpx.Client(timeout=24 * 3600.0, transport=transport)
            return self._http_client

    def close(self) -> None:
        """Ends every open episode and stops the server."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            for ep in list(server.episodes.values()):
                ep.close()
            if server.alive:
                server.stop()

    def tool_schemas(self):
        return self._tools

    def start_batch(self, rows) -> None:
        """Starts the agents of a batch's rows at once (the runner calls it before the resets): their
        first requests come in parallel rather than one reset after the other."""
        self._started = [(row, self._launch(row)) for row in rows]

    def _launch(self, row) -> EpisodeChannel:
        server = self._serve()
        key = secrets.token_hex(8)
        ep = EpisodeChannel(key, self.timeout_s)
        ep.server = server
        server.episodes[key] = ep
        url = f"http://127.0.0.1:{server.server_address[1]}/ep/{key}/v1"
        if self.client == "openai":
            import openai
            client = openai.OpenAI(base_url=url, api_key="jaxrl-" + key, max_retries=0, timeout=24 * 3600.0,
                                   http_client=self._http())
        else:
            client = url
        task = dict(row)

        def run():
            try:
                ep.events.put(("return", self.agent(client, task)))
            except BaseException as e:  # noqa: BLE001 - the agent's failure is the episode's
                ep.events.put(("raise", e))

        threading.Thread(target=run, name=f"jaxrl-agent-{key}", daemon=True).start()
        return ep

    # -- the Environment interface --
    def reset(self, row):
        started = getattr(self, "_started", [])
        if started and started[0][0] is row:
            ep = started.pop(0)[1]
        else:
            for _, other in started:  # not the batch start_batch was told of: its agents are not waited for
                other.close()
                other.server.episodes.pop(other.key, None)
            self._started = []
            ep = self._launch(row)
        try:
            kind, body, slot = ep.wait()
            if kind != "request":
                raise self._ended_early(ep)
            ep.pending = slot
            messages, tools = self._first(ep, body)
        except EpisodeFailed as e:
            self._fail(ep, e)
            raise
        return (messages if self.chat else "".join(m["content"] for m in messages)), ep

    def step(self, ep: EpisodeChannel, turn_text: str) -> StepResult:
        try:
            reply = self._reply(ep, turn_text)
            ep.answer(200, reply)
            kind, body, slot = ep.wait()
            if kind != "request":
                return StepResult(None, self._reward(ep), ep)
            ep.pending = slot
            observation = self._next(ep, body)
        except EpisodeFailed as e:
            self._fail(ep, e)
            raise
        if not self.chat:
            observation = "".join(m["content"] for m in observation)
        return StepResult(observation, None, ep)

    def end(self, ep: EpisodeChannel) -> float | None:
        """After the episode: the agent's reward if it is still to come (None if it already counted)."""
        if ep.closed or (ep.result is not None and ep.pending is None):  # failed, or step counted its reward
            ep.close()
            ep.server.episodes.pop(ep.key, None)
            return None
        ep.close(200, self._completion(ep, "", None, "length"))
        try:
            if ep.result is None:
                kind, body, _ = ep.wait()
                while kind == "request":  # closed: nothing more can come but the return
                    kind, body, _ = ep.wait()
            return self._reward(ep)
        except EpisodeFailed as e:
            self._fail(ep, e)
            raise
        finally:
            ep.server.episodes.pop(ep.key, None)

    def abort(self, ep: EpisodeChannel) -> None:
        """The runner failed the episode (its observation could not be rendered): the agent gets HTTP 400."""
        self._fail(ep, EpisodeFailed("bad_request", "the chat template cannot render the request's messages"))

    # -- helpers --
    def _fail(self, ep: EpisodeChannel, e: EpisodeFailed) -> None:
        ep.close(400, error_body(e.status, f"this episode failed: {e}"))
        ep.server.episodes.pop(ep.key, None)

    def _ended_early(self, ep: EpisodeChannel) -> EpisodeFailed:
        kind, value = ep.result
        if kind == "raise" and isinstance(value, EpisodeFailed):  # the agent named its status
            return value
        if kind == "raise":
            server_down = self._server is None or not self._server.alive
            return EpisodeFailed("disconnected" if server_down else "agent_error",
                                 f"the agent raised {type(value).__name__}: {_line(value)}")
        return EpisodeFailed("agent_error", f"the agent returned {value!r:.40} before any request")

    def _reward(self, ep: EpisodeChannel) -> float:
        kind, value = ep.result
        if kind == "raise":
            raise self._ended_early(ep)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise EpisodeFailed("bad_reward", f"the agent returned {value!r:.60}, not a finite number")
        return float(value)

    def _check_body(self, ep: EpisodeChannel, body: Any) -> list[dict]:
        if not isinstance(body, Mapping) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise EpisodeFailed("bad_request", "the request is not a JSON object with a non-empty 'messages' list")
        if body.get("stream"):
            raise EpisodeFailed("bad_request", "stream=true is not supported by the endpoint")
        if body.get("n", 1) not in (1, None):
            raise EpisodeFailed("bad_request", f"n={body.get('n')!r}: one completion per request")
        tools = body.get("tools") or None
        if ep.tools is not None or ep.turns:
            if tools != ep.tools:
                raise EpisodeFailed("bad_request", "the request's tools differ from the episode's first request's")
        return body["messages"]

    def _first(self, ep: EpisodeChannel, body: Any) -> tuple[list[dict], Any]:
        raw = self._check_body(ep, body)
        messages = [_message(m, f"message {k}") for k, m in enumerate(raw)]
        if messages[-1]["role"] == "assistant":
            raise EpisodeFailed("bad_request", "the last message is the assistant's: nothing to answer")
        tools = body.get("tools") or None
        if tools and not self.chat:
            raise EpisodeFailed("bad_request", "tools need the chat template (env.kwargs.chat=True)")
        with self._lock:  # the chat template renders one tool list for the batch
            if not self._tools_set:
                self._tools, self._tools_set = tools, True
            elif tools != self._tools:
                raise EpisodeFailed("bad_request", "the request's tools differ from the other episodes' "
                                                   "(the endpoint renders one tool list for all)")
        ep.tools = tools
        ep.sent = list(messages)
        return messages, tools

    def _next(self, ep: EpisodeChannel, body: Any) -> list[dict]:
        raw = self._check_body(ep, body)
        if len(raw) <= len(ep.sent):
            raise EpisodeFailed("bad_request", f"the request has {len(raw)} messages, the conversation already "
                                               f"{len(ep.sent)}: it must extend it")
        replies = iter(ep.replies)
        for k, (m, ours) in enumerate(zip(raw, ep.sent)):
            where = f"message {k} ({ours['role']})"
            if ours["role"] == "assistant":
                turn_text, sent = next(replies)
                if not isinstance(m, Mapping) or m.get("role") != "assistant":
                    raise EpisodeFailed("bad_request", f"{where} is not the assistant turn the model drew")
                content = _text(m.get("content"), where)
                calls = _calls_of(m)
                ok = content in (sent["content"] or "", turn_text) and (
                    not calls or calls == [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                           for c in sent.get("tool_calls", [])])
                if not ok:
                    raise EpisodeFailed("bad_request", f"{where} differs from the turn the model drew: the "
                                                       "endpoint keeps the conversation's tokens and cannot "
                                                       "rewrite history")
            else:
                got = _message(m, where)
                if (got["role"], got["content"]) != (ours["role"], ours["content"]):
                    raise EpisodeFailed("bad_request", f"{where} differs from the conversation so far: history "
                                                       "cannot be rewritten")
        new = [_message(m, f"message {len(ep.sent) + k}") for k, m in enumerate(raw[len(ep.sent):])]
        for k, m in enumerate(new):
            if m["role"] not in _OBSERVATION_ROLES:
                raise EpisodeFailed("bad_request", f"message {len(ep.sent) + k} has role {m['role']!r}: new "
                                                   f"messages must be {', '.join(_OBSERVATION_ROLES)} (an assistant "
                                                   "message the model did not draw cannot be trained on)")
        ep.sent.extend(new)
        return new

    def _reply(self, ep: EpisodeChannel, turn_text: str) -> dict:
        calls = []
        content: str | None = turn_text
        if ep.tools:
            parsed, _ = parse_tool_calls(turn_text)
            calls = [{"id": f"call_{ep.key}_{ep.turns}_{j}", "type": "function",
                      "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                     for j, c in enumerate(parsed)]
            if calls:  # the text before the calls is the content
                cut = min((p for p in (turn_text.find("<tool_call>"), turn_text.find("<|python_tag|>")) if p >= 0),
                          default=0)
                content = turn_text[:cut].strip() or None
        reply = self._completion(ep, content, calls, "tool_calls" if calls else "stop")
        message = reply["choices"][0]["message"]
        ep.replies.append((turn_text, message))
        ep.sent.append(message)
        ep.turns += 1
        return reply

    def _completion(self, ep: EpisodeChannel, content, calls, finish_reason: str) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return {"id": f"chatcmpl-{ep.key}-{ep.turns}", "object": "chat.completion", "created": int(time.time()),
                "model": "policy", "choices": [{"index": 0, "message": message, "finish_reason": finish_reason,
                                                "logprobs": None}]}


def _line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:200] if s else ""
