"""The continuous-batching sampler on a paged KV cache (`rollout.decode_slots` = S > 0 and
`rollout.kv_page_size` = Z > 0): memory follows the tokens in flight instead of S slots booked at the
maximum length. The page layout and the paged attention are models/paged.py.

Shapes as in `sampling.slots`: B prompts of P tokens, G = num_samples, N = B*G rows, T = max_new_tokens,
S slots; R row shards (the mesh's data x fsdp x sequence), each with its own pool of M pages of Z tokens
(`rollout.kv_pages`), its B/R prompts, their N/R rows and S/R slots: a slot takes only rows of its
shard's prompts, so every page a slot reads is on its chip. One XLA program per shapes and sampling mode:
  1. prefill as in `slots`; each prompt's keys/values go into Pp = ceil(P/Z) pages of its shard's pool,
     which its G rows read in place (no per-row or per-slot copy); the first token of every row is drawn
     up front (a row whose first token ends it never takes a slot);
  2. a `lax.while_loop`, one decode step of all S slots per iteration. A slot whose next key starts a new
     page takes one from its shard's free list; when fewer pages are free than slots ask for, the rows
     that entered first get them (row order) and the others wait: they skip this step (nothing written,
     nothing drawn) and ask again at the next. If every row of a shard waits (the pool is spent), the
     newest row holding pages is restarted: its pages go back, its record is cleared, and it decodes again
     from its first token -- the same tokens, since token t of row n is always drawn from the same uniform
     (`draw.row_uniforms`). The oldest row can always finish (the pool holds all of its shard's prompts
     plus one row's Wg = ceil(T/Z) pages, checked at start-up), so the loop always ends;
  3. when a row ends its pages go back to the free list, and when the last row of a prompt ends, so do
     the prompt's pages; the slot takes its shard's next pending row, as in `slots`.
A model whose every layer is windowed (`freeing_window`: Mistral-style, a sliding window W and no full
layer) frees what the window has passed. A completion page goes back as soon as no later query of its
row sees any of its keys (`passed_pages`), before the step's grants. A prompt's pages are shared by its
G rows, and a restarted row starts over at its first token: the prompt pages its first token does not
see (`prompt_pages_passed`) are never stored, the others stay until the prompt's last row ends. A row
then holds at most `row_pages` completion pages at once (about W/Z + 1), and the start-up check asks for
that instead of Wg. A model mixing windowed and full layers (Gemma-style) frees nothing: its full layers
read every key, and one page holds a token's keys of every layer.
Each row's tokens, log-probs and MoE routes are those of `slots` for every S, Z and M (up to float
rounding of differently shaped products): tests/test_sampling_paged.py. Memory: M+1 pages per shard and
layer, and one layer's gathered keys/values (S x W*Z) while a step runs (the XLA path; docs/sampling.md).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrl_llm.compile_options import jit
from jaxrl_llm.models import paged
from jaxrl_llm.models.layout import constrain
from jaxrl_llm.models.lm import decode_logits, decode_layer_weights, decode_step, decode_unrolled
from jaxrl_llm.models.moe import NO_ROUTE
from jaxrl_llm.sampling.batch import Rollout
from jaxrl_llm.sampling.draw import draw_tokens, mark, row_uniforms
from jaxrl_llm.sampling.slots import prefill_and_first


def freeing_window(config) -> int | None:
    """The sliding window past which no layer reads a key again, so its pages may be freed: the model's
    `sliding_window` when every layer is windowed, else None. A model mixing windowed and full layers
    keeps every page: its full layers read every key to the end of the row, and one page holds a token's
    keys of all layers (a pool per layer kind would free the windowed layers' half)."""
    return config.sliding_window if config.sliding_window is not None and all(config.sliding_layers) else None


def passed_pages(t, window: int, page_size: int):
    """How many of a row's first completion pages no layer reads again once the row is at token t (the
    query at coordinate P + t and every later one): key i is past when t - i >= window, so page j (keys
    jZ..jZ+Z-1) when (j+1)Z <= t - window + 1. t int or int32 array; returns the same."""
    return jnp.maximum((t - window + 1) // page_size, 0)


def prompt_pages_passed(prompt_length: int, window: int | None, page_size: int) -> int:
    """How many of a prompt's first pages no row of it ever reads (None: no window frees any): prompt
    key c (at coordinate c < P) is past for the first query (P) already when P - c >= window. The last
    page is always kept (it holds the prompt's last key, which the first query sees)."""
    if window is None:
        return 0
    return min(-(-prompt_length // page_size) - 1, max(0, (prompt_length - window + 1) // page_size))


def row_pages(max_new_tokens: int, page_size: int, window: int | None = None) -> int:
    """The most completion pages one row holds at once: all ceil(T/Z), or with a freeing window, from the
    first page its token t still sees to the one t is written in, at the worst t. Past t = window - 1 the
    count is periodic in t with period Z, so the last window + Z tokens reach the worst."""
    if window is None:
        return -(-max_new_tokens // page_size)
    return max(t // page_size + 1 - int(passed_pages(t, window, page_size))
               for t in range(max(0, max_new_tokens - window - page_size), max_new_tokens))


def pages_needed(prompt_length: int, max_new_tokens: int, num_prompts: int, shards: int, page_size: int,
                 window: int | None = None) -> int:
    """The fewest pages a row shard's pool may hold: all of its prompts' pages plus one row's completion --
    with a freeing window (`freeing_window`), only the pages a row still reads."""
    prompt = -(-prompt_length // page_size) - prompt_pages_passed(prompt_length, window, page_size)
    return num_prompts // shards * prompt + row_pages(max_new_tokens, page_size, window)


def page_bytes(config, page_size: int, tensor: int = 1) -> int:
    """Bytes per chip of one page of every layer's keys and values (KV heads over `tensor` when it divides them)."""
    heads = config.num_kv_heads // tensor if config.num_kv_heads % tensor == 0 else config.num_kv_heads
    return 2 * config.num_layers * page_size * heads * config.head_dim * jnp.dtype(config.dtype).itemsize


def pool_pages(config, *, kv_pages: int, page_size: int, prompt_length: int, max_new_tokens: int, prompts: int,
               slots: int, shards: int, tensor: int = 1, free_bytes: int | None = None) -> tuple[int, str]:
    """(pages per row shard, a start-up line saying where the number comes from). kv_pages > 0 is taken as
    given; 0 (auto) is what half of `free_bytes` (the memory a chip has left with parameters and optimizer
    in place; None where the backend does not say, e.g. CPU) holds, at least the fewest the sampler
    accepts and at most what every slot's full row needs (more would never be used)."""
    window = freeing_window(config)
    need = pages_needed(prompt_length, max_new_tokens, prompts, shards, page_size, window)
    full = need + (slots // shards - 1) * row_pages(max_new_tokens, page_size, window)
    per_page = page_bytes(config, page_size, tensor)
    gib = lambda pages: f"{pages * per_page / 2 ** 30:.3g} GiB per chip"
    if kv_pages:
        return kv_pages, (f"rollout.kv_pages={kv_pages} pages of {page_size} tokens per row shard ({gib(kv_pages)}; "
                          f"{full} would hold every slot's whole row)")
    if free_bytes is None:
        return full, (f"rollout.kv_pages=0 (auto): {full} pages of {page_size} tokens per row shard ({gib(full)}), "
                      f"every slot's whole row: this backend reports no free memory; set rollout.kv_pages to page less")
    pages = max(need, min(full, int(free_bytes // 2 // per_page)))
    return pages, (f"rollout.kv_pages=0 (auto): {pages} pages of {page_size} tokens per row shard ({gib(pages)}): "
                   f"half of the {free_bytes / 2 ** 30:.3g} GiB per chip left after parameters and optimizer, "
                   f"between the fewest the sampler accepts ({need}) and every slot's whole row ({full})")


def _push(free, count, ids, keep):
    """The free list (M,) with the pages `ids` (K,) where `keep` pushed on top of its `count` entries."""
    at = jnp.where(keep, count + jnp.cumsum(keep) - 1, free.shape[0])
    return free.at[at].set(ids, mode="drop"), count + jnp.sum(keep, dtype=jnp.int32)


def _release(free, count, own, start, stop):
    """One shard's free list (M,), count () with each slot's completion pages start..stop-1 pushed.
    own (s,Wg) the slots' completion pages; start, stop (s,) int32."""
    j = jnp.arange(own.shape[-1])
    return _push(free, count, own.reshape(-1), ((j >= start[:, None]) & (j < stop[:, None])).reshape(-1))


def _grant(row, t, held, free, count, page_size, idle):
    """One shard: which slots take a page this step (their next key starts one) and which step at all.
    row, t, held (s,) int32; free (M,), count () the free list. Rows that entered first are served first.
    Returns (page (s,) int32 taken or -1, steps (s,) bool, free count)."""
    active = row < idle
    grow = active & (t == held * page_size)
    rank = jnp.zeros_like(row).at[jnp.argsort(jnp.where(grow, row, idle + 1), stable=True)].set(
        jnp.arange(row.shape[0], dtype=jnp.int32))
    granted = grow & (rank < count)
    page = jnp.where(granted, jnp.take(free, jnp.clip(count - 1 - rank, 0, free.shape[0] - 1)), -1)
    return page, active & (~grow | granted), count - jnp.sum(granted, dtype=jnp.int32)


@functools.partial(jit, static_argnames=("config", "max_new_tokens", "num_samples", "slots", "page_size", "pages",
                                         "shards", "top_k", "greedy", "nucleus", "eos_ids", "pad_id", "penalize",
                                         "use_min_p", "row_block"))
def paged_program(config, params, prompts, prompt_mask, rng, temperature, top_p, penalty=1.0, min_p=0.0, *,
                  max_new_tokens, num_samples, slots, page_size, pages, shards=1, top_k, greedy, nucleus, eos_ids,
                  pad_id, penalize=False, use_min_p=False, row_block=None):
    """`generate` with `slots` decode slots on a paged cache of `pages` pages of `page_size` tokens per row
    shard (`shards` of them; see the module docstring); other arguments as `slots.slots_program`."""
    b, p = prompts.shape
    g, t_max, s, z, m, r = num_samples, max_new_tokens, slots, page_size, pages, shards
    n = b * g
    bl, nl, sl = b // r, n // r, s // r  # per shard: prompts, rows, slots
    pp, wg = -(-p // z), -(-t_max // z)  # prompt pages, a row's completion pages
    w = pp + wg
    window = freeing_window(config)  # None: no page is freed before its row (or prompt) ends
    pk = pp - prompt_pages_passed(p, window, z)  # the prompt pages kept: its last pk
    draw = functools.partial(draw_tokens, None, temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                             nucleus=nucleus, penalty=penalty, min_p=min_p if use_min_p else None)
    eos = jnp.asarray(eos_ids, jnp.int32)
    shard_of_slot = jnp.repeat(jnp.arange(r, dtype=jnp.int32), sl)  # (S,)
    global_row = lambda local: jnp.where(local < nl, shard_of_slot.reshape(r, sl) * nl + local, n)  # (R,s)

    # 1. prefill once per prompt; the first token of every row (as `slots`).
    moe = config.num_experts > 0
    offset = 0 if row_block is None else row_block[0]
    prefix_kv, prompt_routes, prompt_len, first, seen0, seen, tokens, logprobs, mask, routes = prefill_and_first(
        config, params, prompts, prompt_mask, rng, draw, num_samples=g, max_new_tokens=t_max, pad_id=pad_id,
        penalize=penalize, offset=offset)

    # The pools: each prompt's kept keys/values in its shard's pages b*Pk..b*Pk+Pk-1, the rest free, page M
    # spare. A window's passed prompt pages are never stored: their logical pages point at page M (masked).
    def pool_of(x, keys: bool):  # (L,B,P,Hkv,hd) -> (L,R,M+1,Hkv,hd,Z) keys / (L,R,M+1,Hkv,Z,hd) values
        lead, kvh, hd = x.shape[0], x.shape[3], x.shape[4]
        x = jnp.pad(x, ((0, 0), (0, 0), (0, pp * z - p), (0, 0), (0, 0))).reshape(lead, r, bl, pp, z, kvh, hd)
        x = x[:, :, :, pp - pk:].reshape(lead, r, bl * pk, z, kvh, hd)
        x = x.transpose(0, 1, 2, 4, 5, 3) if keys else x.transpose(0, 1, 2, 4, 3, 5)
        x = jnp.pad(x, ((0, 0), (0, 0), (0, m + 1 - bl * pk), (0, 0), (0, 0), (0, 0)))
        return constrain(x, ("layers", "batch", None, "act_heads", None, None))
    pool = paged.Pool(pool_of(prefix_kv[0], True), pool_of(prefix_kv[1], False))
    del prefix_kv
    if decode_unrolled(config):
        pool = tuple(paged.Pool(pool.k[l], pool.v[l]) for l in range(config.num_layers))
        no_prefix = ((None, None),) * config.num_layers
    else:
        no_prefix = (None, None)
    weights = decode_layer_weights(config, params)

    # Per shard: its pending rows in row order (then nl: none), the rows still to end per prompt.
    pending = (~jnp.isin(first, eos) & (t_max > 1)).reshape(r, nl)
    local = jnp.arange(nl, dtype=jnp.int32)
    queue = jnp.where(local < jnp.sum(pending, axis=1, keepdims=True),
                      jnp.argsort(~pending, axis=1, stable=True), nl).astype(jnp.int32)  # (R,nl)
    left = jnp.sum(pending.reshape(r, bl, g), axis=-1, dtype=jnp.int32)  # (R,bl)
    prompt_pages = jnp.arange(bl * pk, dtype=jnp.int32).reshape(bl, pk)
    empty = jnp.full((r, m), m, jnp.int32)
    free, count = jax.vmap(_push)(empty, jnp.zeros((r,), jnp.int32),
                                  jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), (r, m)),
                                  jnp.broadcast_to(jnp.arange(m) >= bl * pk, (r, m)))
    free, count = jax.vmap(_push)(free, count, jnp.broadcast_to(prompt_pages.reshape(-1), (r, bl * pk)),
                                  jnp.repeat(left == 0, pk, axis=1))  # prompts none of whose rows decode
    slot_row = queue[:, :sl]
    table_of = lambda row: jnp.concatenate(  # a slot's prompt pages (passed ones: page M), then its completion's
        [jnp.full((*row.shape, pp - pk), m, jnp.int32), prompt_pages[jnp.minimum(row, nl - 1) // g],
         jnp.full((*row.shape, wg), m, jnp.int32)], axis=-1)  # (none yet: page M)
    # held: completion pages taken; gone: how many of the first of them the window has freed.
    state = dict(row=slot_row, t=jnp.zeros((r, sl), jnp.int32), held=jnp.zeros((r, sl), jnp.int32),
                 gone=jnp.zeros((r, sl), jnp.int32),
                 token=jnp.take(first, jnp.minimum(global_row(slot_row), n - 1)), table=table_of(slot_row),
                 free=free, count=count, nxt=jnp.full((r,), sl, jnp.int32), left=left, pool=pool,
                 restarts=jnp.zeros((), jnp.int32), peak=jnp.max(m - count), tokens=tokens, logprobs=logprobs,
                 mask=mask, seen=seen, routes=routes)
    key = jnp.arange(w * z, dtype=jnp.int32)  # logical keys: prompt pages' then the completion's

    def body(st):
        row, t, held, gone, table = st["row"], st["t"], st["held"], st["gone"], st["table"]
        free, count = st["free"], st["count"]
        if window is not None:  # pages no later query of the row reads go back before this step's grants
            passed = jnp.where(row < nl, jnp.minimum(passed_pages(t, window, z), held), gone)
            free, count = jax.vmap(_release)(free, count, table[..., pp:], gone, passed)
            gone = passed
        page, steps, count = jax.vmap(functools.partial(_grant, page_size=z, idle=nl))(row, t, held, free, count)
        after_grant = count
        col = jnp.minimum(pp + held, w - 1)
        table = jnp.where((jnp.arange(w) == col[..., None]) & (page >= 0)[..., None], page[..., None], table)
        held = held + (page >= 0)
        active = row < nl
        # A shard whose every row waits: its newest row holding pages starts over (module docstring, 2).
        stalled = jnp.any(active, axis=1) & ~jnp.any(steps, axis=1)  # (R,)
        victim = jnp.argmax(jnp.where(active & (held > gone), row, -1), axis=1)
        restart = stalled[:, None] & (jnp.arange(sl) == victim[:, None])  # (R,s)

        # The decode step of all S slots; a slot that does not step writes to the spare page M.
        slot_prompt = jnp.minimum(global_row(row), n - 1) // g  # (R,s) global prompt index
        tf, rowf = t.reshape(-1), global_row(row).reshape(-1)
        stepf, promptf = steps.reshape(-1), slot_prompt.reshape(-1)
        write_page = jnp.where(stepf, jnp.take_along_axis(table.reshape(s, w), (pp + tf // z)[:, None].clip(0, w - 1),
                                                          axis=1)[:, 0], m)
        prompt_key = key < pp * z
        key_pos = jnp.where(prompt_key, key, p + key - pp * z)
        key_seen = jnp.where(prompt_key[None], jnp.pad(prompt_mask.astype(bool), ((0, 0), (0, pp * z - p)),
                                                       constant_values=False)[promptf][:, jnp.minimum(key, pp * z - 1)],
                             (key - pp * z)[None] <= tf[:, None])
        view = paged.View(table.reshape(s, w), write_page, jnp.where(stepf, tf % z, 0), key_pos[None].repeat(s, 0),
                          key_seen, p + tf, pp + jnp.max(jnp.where(stepf, tf // z + 1, 0)))
        with jax.named_scope("layers"):
            hidden, pool, *experts = decode_step(config, params, weights, st["token"].reshape(-1),
                                                 jnp.take(prompt_len, promptf) + tf, st["pool"], view, no_prefix,
                                                 None, return_routes=moe)
        rec = jnp.where(stepf, rowf, n)  # the rows whose token this step records (others dropped)
        routes = st["routes"]
        if moe:
            routes = routes.at[:, rec, tf].set(experts[0], mode="drop")
        with jax.named_scope("lm_head"):
            logits = decode_logits(config, params, hidden)
        seen = st["seen"]
        with jax.named_scope("draw"):
            new, logp, blogp = draw(logits, uniform=row_uniforms(rng, rowf + offset, tf + 1),
                                    seen=None if seen is None else jnp.take(seen, jnp.minimum(rowf, n - 1), axis=0))
        seen = None if seen is None else mark(seen, rec, new)
        tokens = st["tokens"].at[rec, tf + 1].set(new, mode="drop")
        logprobs = st["logprobs"].at[rec, :, tf + 1].set(jnp.stack([logp, blogp], 1), mode="drop")
        mask = st["mask"].at[rec, tf + 1].set(1, mode="drop")
        new = new.reshape(r, sl)
        finished = steps & (jnp.isin(new, eos) | (t + 2 >= t_max))

        # A restarted row: its record back to its first token, its pages freed below.
        again = jnp.where(restart, global_row(row), n).reshape(-1)
        tokens = tokens.at[again, 1:].set(pad_id, mode="drop")
        logprobs = logprobs.at[again, :, 1:].set(0.0, mode="drop")
        mask = mask.at[again, 1:].set(0, mode="drop")
        if moe:
            routes = routes.at[:, again, 1:].set(NO_ROUTE, mode="drop")
        if seen is not None:
            fresh_seen = mark(jnp.take(seen0, jnp.minimum(again, n - 1) // g, axis=0), jnp.arange(s),
                              jnp.take(first, jnp.minimum(again, n - 1)))
            seen = seen.at[again].set(fresh_seen, mode="drop")

        # Pages back: those of ended and restarted rows; a prompt's when its last row ends.
        done = finished | restart
        free, count = jax.vmap(_release)(free, count, table[..., pp:], gone, jnp.where(done, held, gone))
        local_prompt = jnp.minimum(row, nl - 1) // g
        left = st["left"] - jax.vmap(lambda lp, f: jnp.zeros((bl,), jnp.int32).at[lp].add(f.astype(jnp.int32)))(
            local_prompt, finished)
        ended = (left == 0) & (st["left"] > 0)  # (R,bl)
        free, count = jax.vmap(_push)(free, count, jnp.broadcast_to(prompt_pages.reshape(-1), (r, bl * pk)),
                                      jnp.repeat(ended, pk, axis=1))

        # Refill the ended slots from the shard's queue; a restarted slot keeps its row, from token 0.
        nxt = st["nxt"]
        fresh = jnp.take_along_axis(jnp.pad(queue, ((0, 0), (0, sl)), constant_values=nl),
                                    jnp.clip(nxt[:, None] + jnp.cumsum(finished, axis=1) - 1, 0, nl + sl - 1), axis=1)
        row = jnp.where(finished, fresh, row)
        token = jnp.where(done, jnp.take(first, jnp.minimum(global_row(row), n - 1)),
                          jnp.where(steps, new, st["token"]))
        t = jnp.where(done, 0, jnp.where(steps, t + 1, t))
        held, gone = jnp.where(done, 0, held), jnp.where(done, 0, gone)
        table = jnp.where(finished[..., None], table_of(row), table)
        return dict(row=row, t=t, held=held, gone=gone, token=token, table=table, free=free, count=count,
                    nxt=nxt + jnp.sum(finished, axis=1, dtype=jnp.int32), left=left, pool=pool,
                    restarts=st["restarts"] + jnp.sum(stalled, dtype=jnp.int32),
                    peak=jnp.maximum(st["peak"], jnp.max(m - after_grant)), tokens=tokens, logprobs=logprobs,
                    mask=mask, seen=seen, routes=routes)

    state = jax.lax.while_loop(lambda st: jnp.any(st["row"] < nl), body, state)
    tokens, mask = state["tokens"], state["mask"]
    ended = jnp.any(jnp.isin(tokens, eos) & (mask == 1), axis=-1)
    return Rollout(tokens=tokens, logprobs=state["logprobs"][:, 0], behavior_logprobs=state["logprobs"][:, 1],
                   mask=mask, lengths=jnp.sum(mask, axis=-1), truncated=~ended,
                   prompt_tokens=jnp.repeat(prompts, g, axis=0), prompt_mask=jnp.repeat(prompt_mask, g, axis=0),
                   routes=state["routes"], prompt_routes=jnp.repeat(prompt_routes, g, axis=1) if moe else None,
                   page_stats=jnp.stack([state["restarts"], state["peak"]]))
