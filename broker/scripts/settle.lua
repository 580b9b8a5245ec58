#!lua
--! include _fence
--! include _audit
-- settle: the lease holder answers or cancels pending requests (one call for every settlement a
-- provider has queued); for each request the first terminal transition wins. An answer may also be
-- remembered (decisions), atomically with its settlement and under the same fence.
-- KEYS[1] lease            the provider lease
-- KEYS[2] requests         the requests stream
-- KEYS[3] audit            the audit stream
-- KEYS[4] decisions        the decisions index (hash: decision id -> decision key)
-- KEYS[5] decision_expiry  the decisions expiry (zset: id -> unix ms)
-- then per settlement, in order, from k = 6 (then past the settlement before's keys):
-- KEYS[k] request          the request hash
-- KEYS[k + 1] outcome_key  the outcome key
-- KEYS[k + 2] inbox        the asker's inbox
-- KEYS[k + 3] durable      the durable key of a keyed ask (the request hash again when unkeyed)
-- KEYS[k + 4] decision_keys  one decision key per decision (D of them)
-- ARGV[1] fence            '<epoch>:<token>:'
-- ARGV[2] provider         provider name
-- ARGV[3] epoch
-- ARGV[4] group
-- ARGV[5] audit_max        the audit's max length
-- ARGV[6] result_ttl       result TTL ms
-- ARGV[7] hold_notices     '1' to hold the askers' notices back (the caller pushes them once replicas confirm;
--                          min_replicas)
-- then per settlement, in order, from a = 8 (then past the settlement before's arguments):
-- ARGV[a] rid              request id
-- ARGV[a + 1] state        'answered' | 'cancelled'
-- ARGV[a + 2] outcome      outcome JSON
-- ARGV[a + 3] by           who, for the audit ('' when unknown)
-- ARGV[a + 4] call         this call's unique id
-- ARGV[a + 5] asker        the asker's identity for the audit ('verified': a pinned gateway attested it; 'claimed')
-- ARGV[a + 6] asked        what was asked, for the audit entry's asked field (JSON, broker/audit.py asked_of: the
--                          agent, each question's id and text; '' for none)
-- ARGV[a + 7] route        the groups the card was routed to when settled, for the audit entry's route field (a JSON
--                          array, '[]': routed to nobody, everyone saw it; '': no field, when no policy of the provider
--                          routes: a history routing by policies then shows its text only to those who see every card,
--                          docs/approvals.md)
-- ARGV[a + 8] decisions    D, the number of decisions to remember with it, usually '0' ('-1': another asker of the
--                          coalesced card above, see below), then five per decision: decision id, TTL ms, the selected
--                          labels (a JSON array), a summary (JSON: scope, agent, fingerprint, question, header), its
--                          signature (JSON, broker/decisions.py DecisionProof: what an asker checks before the
--                          decision answers it)
-- returns {'err', 'LEASE_LOST', message} for the whole call, or {'ok', {one reply per settlement}}, each
--   {'ok'} | {'ok', client id} | {'err', CODE, message}
-- where a client id names an asking process still to be told (RPUSH '<request id> <outcome>' onto its inbox):
-- with ARGV[7] '1', every asker waiting (not away); else one whose inbox is not the settlement's (a keyed ask
-- re-attached from another process since the provider learnt its client).
-- A retry of the same call after a lost reply finds its own settlement and succeeds again. A decision is
-- refused (BAD_ANSWER, the request stays pending) for a request whose hash says remember '0' (the asker's last
-- word: a re-attach may opt out; a hash written before that field existed falls back to its ask entry).
-- A coalesced card's decisions go with its first asker's settlement, and its other askers follow with D '-1':
-- when that first request is no longer pending (withdrawn or lapsed just before), the decisions are written
-- with the next of them settled here, so that no one asker's fate loses them. Decisions whose first key
-- already holds their id (written by an earlier call for the same card) are not written again.
-- A keyed request (asked with a key) keeps its outcome for its detach grace if that is longer than the
-- result TTL; while its asker is away no notice is pushed (nobody reads that inbox, or a process that
-- detached would clean the outcome up): the asker that re-attaches reads the outcome. Its durable key, while it
-- still names the request, gets the hash's TTL: an answer never collected leaves nothing behind once its request
-- lapses, with or without the maintenance worker (the key was set to outlive any request it may name).
local lost = lease_lost(KEYS[1], ARGV[1])
if lost then
  return lost
end
local replies = {}
local done = {}
local remembered = false
local now = nil
local pushed = {}
local function opted_out(entry)
  if not entry or entry == '' then return false end
  local found = redis.call('XRANGE', KEYS[2], entry, entry)
  if not found[1] then return false end
  local fields = found[1][2]
  for f = 1, #fields, 2 do
    if fields[f] == 'remember' then return fields[f + 1] == '0' end
  end
  return false
end
local carry = nil -- {key index, argument index, D}: a card's decisions its first asker's settlement did not write
local k, a = 6, 8
while a <= #ARGV do
  local rid, state, outcome, by, call = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local decisions = tonumber(ARGV[a + 8])
  local dk, da = k + 4, a + 9
  local held = carry
  carry = nil
  local r = redis.call('HMGET', KEYS[k], 'state', 'entry', 'settle_call', 'by', 'grace', 'away', 'client', 'remember')
  local client = r[7] or ''
  local waiting = not r[6] and client ~= ''
  if not r[1] then
    replies[#replies + 1] = {'err', 'NOT_PENDING', 'request ' .. rid .. ' is no longer pending'}
    if decisions > 0 then carry = {dk, da, decisions} elseif decisions < 0 then carry = held end
  elseif r[1] ~= 'pending' then
    if r[3] == call then
      -- a retry: what it carried was written the first time
      replies[#replies + 1] = (ARGV[7] == '1' and waiting) and {'ok', client} or {'ok'}
    else
      local who = ''
      if r[4] and r[4] ~= '' then who = ' by ' .. r[4] end
      replies[#replies + 1] = {'err', 'NOT_PENDING', 'request ' .. rid .. ' is already ' .. r[1] .. who}
      if decisions > 0 then carry = {dk, da, decisions} elseif decisions < 0 then carry = held end
    end
  elseif decisions > 0 and (state ~= 'answered' or r[8] == '0' or (not r[8] and opted_out(r[2]))) then
    replies[#replies + 1] = {'err', 'BAD_ANSWER', 'request ' .. rid ..
      ' cannot be remembered: only an answer is, and its asker asked for a human every time (remember=False)'}
  else
    redis.call('HSET', KEYS[k], 'state', state, 'settle_call', call, 'epoch', ARGV[3], 'by', by)
    -- the TTLs go as the argument's text unless computed: Redis prints a Lua number with snprintf('%.17g')
    local keep, hash_keep = ARGV[6], ARGV[6]
    if r[5] then
      -- keyed: the outcome waits the grace out; the hash outlives it, for away_end.lua's audit
      keep = math.max(tonumber(keep), tonumber(r[5]))
      hash_keep = keep + 60000
    end
    redis.call('PEXPIRE', KEYS[k], hash_keep)
    if r[5] and KEYS[k + 3] ~= KEYS[k] and redis.call('GET', KEYS[k + 3]) == rid then
      redis.call('PEXPIRE', KEYS[k + 3], hash_keep)
    end
    redis.call('SET', KEYS[k + 1], outcome, 'PX', keep)
    done[#done + 1] = r[2]
    local tell = ''
    if waiting and (ARGV[7] == '1' or string.sub(KEYS[k + 2], -#client - 1) ~= ':' .. client) then
      tell = client
    elseif waiting then
      redis.call('RPUSH', KEYS[k + 2], rid .. ' ' .. outcome)
      if not pushed[KEYS[k + 2]] then -- the settlements of one call mostly share their asker's inbox
        redis.call('PEXPIRE', KEYS[k + 2], ARGV[6])
        pushed[KEYS[k + 2]] = true
      end
    end
    if ARGV[a + 7] ~= '' then -- a route recorded only where policies route: an audit field costs 4 % of a settlement
      audit_append(KEYS[3], ARGV[5], 'event', state, 'rid', rid, 'provider', ARGV[2], 'epoch', ARGV[3], 'by', by,
        'asker', ARGV[a + 5], 'outcome', outcome, 'asked', ARGV[a + 6], 'route', ARGV[a + 7])
    else
      audit_append(KEYS[3], ARGV[5], 'event', state, 'rid', rid, 'provider', ARGV[2], 'epoch', ARGV[3], 'by', by,
        'asker', ARGV[a + 5], 'outcome', outcome, 'asked', ARGV[a + 6])
    end
    local from_k, from_a, count = dk, da, decisions
    if decisions < 0 then
      count = 0
      if held and state == 'answered' and r[8] ~= '0' and (r[8] or not opted_out(r[2])) then
        from_k, from_a, count = held[1], held[2], held[3]
      end
    elseif decisions > 0 and redis.call('HGET', KEYS[dk], 'id') == ARGV[da] then
      count = 0
    end
    for j = 0, count - 1 do
      local key, d = KEYS[from_k + j], from_a + 5 * j
      local id, ttl = ARGV[d], tonumber(ARGV[d + 1])
      if not now then
        local t = redis.call('TIME')
        now = t[1] * 1000 + math.floor(t[2] / 1000)
      end
      local previous = redis.call('HGET', key, 'id')
      if previous then
        redis.call('HDEL', KEYS[4], previous)
        redis.call('ZREM', KEYS[5], previous)
        redis.call('DEL', key)
      end
      redis.call('HSET', key, 'id', id, 'selected', ARGV[d + 2], 'summary', ARGV[d + 3], 'by', by,
        'provider', ARGV[2], 'rid', rid, 'at', now, 'expires', now + ttl, 'proof', ARGV[d + 4])
      redis.call('PEXPIRE', key, ttl)
      redis.call('HSET', KEYS[4], id, key)
      redis.call('ZADD', KEYS[5], now + ttl, id)
      audit_append(KEYS[3], ARGV[5], 'event', 'remembered', 'decision', id, 'rid', rid,
        'provider', ARGV[2], 'epoch', ARGV[3], 'by', by, 'ttl', ttl, 'summary', ARGV[d + 3])
      remembered = true
    end
    replies[#replies + 1] = tell ~= '' and {'ok', tell} or {'ok'}
  end
  local own = math.max(decisions, 0)
  k, a = dk + own, da + 5 * own
end
if remembered then
  -- the index never outgrows the live decisions: drop the expired, and let it expire with the last one
  local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 500)
  if #expired > 0 then
    redis.call('HDEL', KEYS[4], unpack(expired))
    redis.call('ZREM', KEYS[5], unpack(expired))
  end
  local last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
  if last[2] then
    local left = math.max(1, tonumber(last[2]) - now)
    redis.call('PEXPIRE', KEYS[4], left)
    redis.call('PEXPIRE', KEYS[5], left)
  end
end
if #done > 0 then
  redis.pcall('XACK', KEYS[2], ARGV[4], unpack(done))
  redis.call('XDEL', KEYS[2], unpack(done))
end
return {'ok', replies}
