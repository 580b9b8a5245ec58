#!lua
--! include _ask_gate
--! include _ask_attach
--! include _ask_decisions
--! include _ask_enqueue
-- ask: the caller gate and the enqueue, as one atomic step: gate, then a keyed ask's re-attach, then remembered
-- decisions, then the enqueue, each in a helper of its own (_ask_gate.lua, _ask_attach.lua, _ask_decisions.lua,
-- _ask_enqueue.lua, included above: broker/_lua.py replaces each include line with the helper's code). The
-- arguments are named once, below (k.* and a.*); the helpers use the names only.
-- KEYS[1] k.requests   the requests stream
-- KEYS[2] k.request    the request hash
-- KEYS[3] k.record     the agent record (the request hash when no agent)
-- KEYS[4] k.asklog     the askers' log (qb:{NS}:asklog: the asker may not write the audit, the answering side's)
-- KEYS[5] k.durable    a keyed ask's durable key (the request hash when unkeyed)
-- KEYS[6] k.named      the request hash the durable key named when the asker read it (KEYS[2] when it named none)
-- KEYS[7] k.outcome    the outcome key (absent when checking the gate only)
-- KEYS[8] k.away       the away zset (absent when checking the gate only)
-- The keys an asker only reads (the lease, the standbys, the decisions) come in ARGV, not KEYS: Redis checks a
-- script's KEYS for write access (EVAL may write any of them), and the asker's Redis user may only read these
-- (broker/roles.py); every command on them is still checked against that user. They share the namespace's hash
-- tag, so the script stays in one Cluster slot.
-- ARGV[1]  a.rid          request id
-- ARGV[2]  a.body         the request JSON
-- ARGV[3]  a.agent        agent id ('' for none)
-- ARGV[4]  a.token        agent token ('' for none)
-- ARGV[5]  a.client       client id (the asking process)
-- ARGV[6]  a.request_ttl  request TTL ms
-- ARGV[7]  a.log_max      the askers' log's max length
-- ARGV[8]  a.timeout      the asker's timeout ms ('' for none): the hash's 'deadline', by the Redis clock
-- ARGV[9]  a.gate_only    '1' to check the gate only, enqueueing nothing
-- ARGV[10] a.token_sha    the token's SHA-1, used only where the Lua runtime lacks redis.sha1hex (fakeredis)
-- ARGV[11] a.key          the ask's key ('' for an unkeyed ask)
-- ARGV[12] a.grace        its detach grace ms
-- ARGV[13] a.digest       the request's digest (the same key with another digest is BAD_REQUEST)
-- ARGV[14] a.solo         'solo' when the asker opted out of coalescing (ask(coalesce=False)): coalesce '0'
-- ARGV[15] a.remember     '1' to look decisions up, '0' opted out (remember=False: no provider may remember its
--                         answer), 'x' no lookup (the asker refused what a lookup found) but rememberable, absent:
--                         no lookup
-- ARGV[16] a.result_ttl   result TTL ms
-- ARGV[17] a.lease        the provider lease key
-- ARGV[18] a.standbys     the standbys zset key
-- ARGV[19] a.questions    n, the number of questions looked up (0: no lookup); then their ids: ARGV[20 + i],
--                         question i's, i = 0 .. n - 1
-- then a.decision_keys: two per question from ARGV[20 + n + 2i], the agent's decision key for the question's
-- fingerprint (the namespace's key again when no agent), then the namespace's decision key
-- ARGV[20 + 3n] a.attest a gateway's attestation of this ask ('' or absent for none): carried on the stream entry as
--                        'attest'; the provider verifies it (broker/signing.py), the script does not
-- The request hash is the record of who asks (docs/architecture.md): 'client' (the asking process), 'away',
-- 'remember' and 'coalesce' ('0': opted out), 'deadline'. The stream entry's copies say how it was first asked.
-- returns {'ok', entry id} | {'decided', outcome JSON, Redis time ms, records} | {'err', CODE, message}, and for a
-- keyed ask also {'attached', previous client id} | {'settled', state} | {'retry'} (_ask_attach.lua says when)
-- Idempotent on the request id, so a retried call after a lost reply enqueues once (or attaches again).
-- Batched (the asks of one pipeline in one call): ARGV[1] '*', ARGV[2] n, then ARGV[3 + 2i] and ARGV[4 + 2i], ask i's key
-- and argument counts; each ask's KEYS and ARGV as above follow one another, the KEYS from KEYS[1], the ARGV after
-- the counts. Returns {one reply per ask, in order}. Each ask is judged as if called alone.
local function named_keys(KEYS)
  return {requests = KEYS[1], request = KEYS[2], record = KEYS[3], asklog = KEYS[4], durable = KEYS[5],
    named = KEYS[6], outcome = KEYS[7], away = KEYS[8]}
end
local function named_args(ARGV)
  local n = tonumber(ARGV[19] or '0') or 0
  return {rid = ARGV[1], body = ARGV[2], agent = ARGV[3], token = ARGV[4], client = ARGV[5],
    request_ttl = ARGV[6], log_max = ARGV[7], timeout = ARGV[8], gate_only = ARGV[9] == '1', token_sha = ARGV[10],
    key = ARGV[11] or '', grace = ARGV[12], digest = ARGV[13], solo = ARGV[14] == 'solo', remember = ARGV[15],
    result_ttl = ARGV[16], lease = ARGV[17], standbys = ARGV[18],
    questions = {unpack(ARGV, 20, 19 + n)}, decision_keys = {unpack(ARGV, 20 + n, 19 + 3 * n)},
    attest = ARGV[20 + 3 * n] or ''}
end
-- call: what the asks of one call share, each read once per call, not once per ask (every Redis command of an ask
-- counts: docs/benchmarks-budget.md): call.now, the Redis clock in ms, and call.seen, the reads of keys no ask here
-- writes (the agent record's process field and owner, whether a provider is up), by key.
local function ask(KEYS, ARGV, call)
  local k, a = named_keys(KEYS), named_args(ARGV)
  -- a retry after a lost reply: the request is there already
  if not a.gate_only and redis.call('EXISTS', k.request) == 1 then
    return {'ok', redis.call('HGET', k.request, 'entry') or ''}
  end
  if not call.now then
    local t = redis.call('TIME')
    call.now = t[1] * 1000 + math.floor(t[2] / 1000)
    -- the times written go as text made here: Redis prints a Lua number given to a command with snprintf('%.17g'),
    -- the C library's float printer (docs/benchmarks-budget.md)
    call.now_text = string.format('%d', call.now)
  end
  a.now, a.now_text, a.seen = call.now, call.now_text, call.seen
  local fp, refused = ask_gate(k, a)
  if refused then
    return refused
  end
  if a.gate_only then
    return {'ok', ''}
  end
  local now = a.now
  local deadline = a.timeout ~= '' and string.format('%d', now + tonumber(a.timeout)) or ''
  if a.key ~= '' then
    local attached = ask_attach(k, a, fp, deadline)
    if attached then
      return attached
    end
  end
  -- after a re-attach (its own request answers it) and before NO_PROVIDER (a decision needs no provider up)
  local decided = ask_decided(k, a, fp, now)
  if decided then
    return decided
  end
  return ask_enqueue(k, a, fp, now, deadline)
end
local call = {seen = {}}
if ARGV[1] ~= '*' then
  return ask(KEYS, ARGV, call)
end
local n = tonumber(ARGV[2])
local replies = {}
local k, a = 0, 2 + 2 * n
for i = 0, n - 1 do
  local nk, na = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  replies[i + 1] = ask({unpack(KEYS, k + 1, k + nk)}, {unpack(ARGV, a + 1, a + na)}, call)
  k, a = k + nk, a + na
end
return replies
