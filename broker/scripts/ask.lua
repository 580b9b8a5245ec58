#!lua
-- ask: the caller gate and the enqueue, as one atomic step.
-- KEYS[1] requests stream   KEYS[2] request hash   KEYS[3] agent record (the request hash when no agent)
-- KEYS[4] the askers' log (qb:{NS}:asklog: the asker may not write the audit, which is the answering side's)
-- KEYS[5] a keyed ask's durable key (the request hash when unkeyed)
-- KEYS[6] the request hash the durable key named when the asker read it (KEYS[2] when it named none)
-- The keys an asker only reads (the lease, the standbys, the decisions) come in ARGV, not KEYS: Redis checks a
-- script's KEYS for write access (EVAL may write any of them), and the asker's Redis user may only read these
-- (broker/roles.py); every command on them is still checked against that user. They share the namespace's hash
-- tag, so the script stays in one Cluster slot.
-- ARGV[1] request id   ARGV[2] request JSON   ARGV[3] agent id ('' for none)   ARGV[4] agent token ('' for none)
-- ARGV[5] client id    ARGV[6] request TTL ms ARGV[7] log max length           ARGV[8] the asker's timeout ms ('' for none)
-- ARGV[9] '1' to check the gate only, enqueueing nothing
-- ARGV[10] the token's SHA-1, used only where the Lua runtime lacks redis.sha1hex (fakeredis)
-- ARGV[11] the ask's key ('' for an unkeyed ask)   ARGV[12] its detach grace ms   ARGV[13] the request's digest
-- ARGV[14] 'solo' when the asker opted out of coalescing (ask(coalesce=False)): the entry says coalesce '0'
-- (KEYS[7] and ARGV[15..]: see the remembered decisions block below)   ARGV[17] the provider lease key
-- ARGV[18] the standbys zset key   KEYS[8] the away zset (absent when checking the gate only)
-- ARGV[20 + 3n] (after the decisions block's arguments) a gateway's attestation of this ask ('' or absent for none):
-- carried on the stream entry as 'attest'; the provider verifies it (broker/signing.py), the script does not
-- The request hash is the record of who asks (docs/architecture.md): 'client' (the asking process), 'away',
-- 'remember' and 'coalesce' ('0': opted out), 'deadline'. The stream entry's copies say how it was first asked.
-- returns {'ok', entry id} | {'decided', outcome JSON, Redis time ms, records} | {'err', CODE, message}, and for a
-- keyed ask also
--   {'attached', previous client id} the key's pending request (KEYS[6]) is this asker's now; the previous client
--                                    ('' for none waiting) is told it was replaced, also after a lost reply: the
--                                    hash's 'replaced' keeps it for a retry of the same call (same ARGV[1])
--   {'settled', state}                 it was answered or cancelled while the asker was away: read its outcome
--   {'retry'}                          the durable key changed since the asker read it: read it and call again
-- The stream entry carries the request JSON too, so the provider presents it without reading the hash.
-- Idempotent on the request id, so a retried call after a lost reply enqueues once (or attaches again).
-- Batched (the asks of one pipeline in one call): ARGV[1] '*', ARGV[2] n, then ARGV[3 + 2i] and ARGV[4 + 2i], ask i's key
-- and argument counts; each ask's KEYS and ARGV as above follow one another, the KEYS from KEYS[1], the ARGV after
-- the counts. Returns {one reply per ask, in order}. Each ask is judged as if called alone.
local function ask(KEYS, ARGV)
if ARGV[9] ~= '1' and redis.call('EXISTS', KEYS[2]) == 1 then
  return {'ok', redis.call('HGET', KEYS[2], 'entry') or ''}
end
local agent_fp = ''
if ARGV[3] ~= '' then
  if redis.sha1hex then agent_fp = redis.sha1hex(ARGV[4]) else agent_fp = ARGV[10] end
  -- one field per live process of the agent (agent_register.lua): this token's, and not lapsed
  local record = redis.call('HMGET', KEYS[3], 'p:' .. agent_fp, 'owner')
  local clock = redis.call('TIME')
  if not record[1] or tonumber(record[1]) < clock[1] * 1000 + math.floor(clock[2] / 1000) then
    return {'err', 'CALLER_NOT_LIVE', 'agent ' .. ARGV[3] .. ' is not the live instance'}
  end
  if record[2] and record[2] ~= '' then
    return {'err', 'DELEGATED_CALLER', 'agent ' .. ARGV[3] .. ' is owned by agent ' .. record[2] ..
      '; put the unresolved question into your final result for your parent instead'}
  end
end
if ARGV[9] == '1' then
  return {'ok', ''}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local deadline = ''
if ARGV[8] ~= '' then deadline = now + tonumber(ARGV[8]) end
local key = ARGV[11] or ''
-- A keyed ask: re-attach to the key's request while it lives (pending, or settled and not yet collected).
if key ~= '' then
  local named = redis.call('GET', KEYS[5])
  local read_as = string.sub(KEYS[2], 1, #KEYS[2] - #ARGV[1]) .. (named or ARGV[1])
  if read_as ~= KEYS[6] then
    return {'retry'}
  end
  if named then
    local r = redis.call('HMGET', KEYS[6], 'state', 'digest', 'client', 'away', 'delivered', 'request', 'created',
      'remember', 'coalesce', 'replaced')
    local live = r[1] == 'pending' or ((r[1] == 'answered' or r[1] == 'cancelled') and r[6])
    if live and r[2] ~= ARGV[13] then
      return {'err', 'BAD_REQUEST', 'key ' .. key .. ' names a different request, asked at ' .. r[7] ..
        ' (unix ms) and still ' .. r[1] .. '; ask it with a new key'}
    end
    if live and r[1] ~= 'pending' then
      redis.call('HSET', KEYS[6], 'client', ARGV[5]) -- this asker collects it (settled_cleanup.lua)
      redis.call('ZREM', KEYS[8], named)
      return {'settled', r[1]}
    end
    if live then
      local remember, coalesce = ARGV[15] == '0' and '0' or '1', ARGV[14] == 'solo' and '0' or '1'
      local previous = r[3] or ''
      if previous == ARGV[5] and r[10] then -- a retry of this very re-attach: the replaced client is still told
        local was, by = string.match(r[10], '^(%S*) (%S+)$')
        if by == ARGV[1] then previous = was end
      end
      redis.call('HSET', KEYS[6], 'client', ARGV[5], 'agent_fp', agent_fp, 'deadline', deadline, 'remember', remember,
        'coalesce', coalesce)
      if r[3] ~= ARGV[5] then
        redis.call('HSET', KEYS[6], 'replaced', (r[3] or '') .. ' ' .. ARGV[1])
      end
      if r[4] then
        redis.call('HDEL', KEYS[6], 'away')
        redis.call('ZREM', KEYS[8], named)
      end
      if r[5] and (r[4] or r[3] ~= ARGV[5] or (r[8] or '1') ~= remember or (r[9] or '1') ~= coalesce) then
        -- the provider that shows it re-reads who asks from the hash (settlements go to the new client)
        redis.call('XADD', KEYS[1], '*', 'kind', 'back', 'rid', named, 'client', ARGV[5])
      end
      if r[3] ~= ARGV[5] then
        redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'event', 'attached', 'rid', named, 'agent', ARGV[3],
          'client', ARGV[5], 'key', key)
      end
      return {'attached', previous}
    end
  end
end
-- ---- remembered decisions (issue 15) -------------------------------------------------------------------------
-- KEYS[7] outcome key
-- ARGV[15] '1' to look decisions up, '0' opted out (remember=False; the ask entry
-- says so, and no provider may remember its answer), 'x' no lookup (the asker refused what the lookup found) but
-- rememberable, absent: no lookup   ARGV[16] result TTL ms
-- ARGV[19] n, the number of questions looked up (0: no lookup)   ARGV[20 + i] question i's id, i = 0 .. n - 1
-- then two keys per question, at ARGV[20 + n + 2i]: the agent's decision key for the question's fingerprint (the
-- namespace's key again when no agent), then the namespace's decision key
-- When every question has a live decision (the agent's first, then the namespace's), the request is settled here
-- as answered (after a keyed ask's re-attach: its own request answers it), before the NO_PROVIDER check (a
-- remembered decision answers with no provider up): request hash, outcome key, askers' log 'answered' by
-- 'decision:<id>[,<id>...]'; nothing is enqueued and the reply is {'decided', outcome JSON, now ms, records}: per
-- question its decision's id, selected labels and signature (proof), which the asker verifies before the answer
-- counts (a decision hash is only as trustworthy as its signature: broker/decisions.py verified_decisions).
-- The answer echoes this request's question ids.
local looked_up = tonumber(ARGV[19] or '0') or 0
if ARGV[15] == '1' and looked_up > 0 then
  local items, ids, setters, records = {}, {}, {}, {}
  for i = 0, looked_up - 1 do
    local mine, shared = ARGV[20 + looked_up + 2 * i], ARGV[21 + looked_up + 2 * i]
    local d = redis.call('HMGET', mine, 'id', 'selected', 'by', 'provider', 'proof')
    if not d[1] and shared ~= mine then
      d = redis.call('HMGET', shared, 'id', 'selected', 'by', 'provider', 'proof')
    end
    if not d[1] then
      items = nil
      break
    end
    items[#items + 1] = '{"id":' .. cjson.encode(ARGV[20 + i]) .. ',"selected":' .. d[2] .. '}'
    ids[#ids + 1] = d[1]
    setters[#setters + 1] = (d[3] or '') .. ' via ' .. (d[4] or '')
    records[#records + 1] = d[1]
    records[#records + 1] = d[2] or ''
    records[#records + 1] = d[5] or ''
  end
  if items then
    local decided = '{"answer":{"answers":[' .. table.concat(items, ',') .. ']}}'
    local by = 'decision:' .. table.concat(ids, ',')
    redis.call('HSET', KEYS[2], 'state', 'answered', 'request', ARGV[2], 'agent', ARGV[3], 'agent_fp', agent_fp,
      'client', ARGV[5], 'created', now, 'deadline', '', 'by', by, 'settle_call', by)
    redis.call('PEXPIRE', KEYS[2], ARGV[16])
    redis.call('SET', KEYS[7], decided, 'PX', ARGV[16])
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'event', 'answered', 'rid', ARGV[1], 'agent', ARGV[3],
      'client', ARGV[5], 'by', by, 'decided_by', table.concat(setters, ', '), 'outcome', decided)
    return {'decided', decided, now, records}
  end
end
-- ---- end of remembered decisions ------------------------------------------------------------------------------
if redis.call('EXISTS', ARGV[17]) == 0 and redis.call('ZCOUNT', ARGV[18], now, '+inf') == 0 then
  return {'err', 'NO_PROVIDER', 'no provider holds or stands by for this namespace'}
end
local fields = {'kind', 'ask', 'rid', ARGV[1], 'client', ARGV[5], 'agent', ARGV[3], 'request', ARGV[2],
  'remember', ARGV[15] == '0' and '0' or '1'}
if ARGV[14] == 'solo' then -- ask(coalesce=False): never presented together with identical requests
  fields[#fields + 1] = 'coalesce'
  fields[#fields + 1] = '0'
end
local attest = ARGV[20 + 3 * looked_up] or ''
if attest ~= '' then
  fields[#fields + 1] = 'attest'
  fields[#fields + 1] = attest
end
local entry = redis.call('XADD', KEYS[1], '*', unpack(fields))
redis.call('HSET', KEYS[2], 'state', 'pending', 'request', ARGV[2], 'agent', ARGV[3], 'agent_fp', agent_fp,
  'client', ARGV[5], 'entry', entry, 'created', now, 'deadline', deadline, 'remember', ARGV[15] == '0' and '0' or '1', 'coalesce', ARGV[14] == 'solo' and '0' or '1')
redis.call('PEXPIRE', KEYS[2], ARGV[6])
if key ~= '' then
  redis.call('HSET', KEYS[2], 'key', key, 'grace', ARGV[12], 'digest', ARGV[13])
  -- Outlives the request and a kept answer; a name whose request ended is simply asked anew.
  redis.call('SET', KEYS[5], ARGV[1], 'PX', 2 * tonumber(ARGV[6]) + tonumber(ARGV[12]))
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'event', 'asked', 'rid', ARGV[1], 'agent', ARGV[3],
  'client', ARGV[5])
return {'ok', entry}
end
if ARGV[1] ~= '*' then
  return ask(KEYS, ARGV)
end
local n = tonumber(ARGV[2])
local replies = {}
local k, a = 0, 2 + 2 * n
for i = 0, n - 1 do
  local nk, na = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  replies[i + 1] = ask({unpack(KEYS, k + 1, k + nk)}, {unpack(ARGV, a + 1, a + na)})
  k, a = k + nk, a + na
end
return replies
