#!lua
--! include _audit
--! include _away
--! include _restart
-- reap: withdraw a pending request whose asker is gone (housekeeping; the same transition as withdraw.lua).
-- KEYS[1] request         the request hash
-- KEYS[2] requests        the requests stream
-- KEYS[3] record          the agent record (the request hash when no agent)
-- KEYS[4] liveness        the asker's client liveness key
-- KEYS[5] inbox           the asker's inbox
-- KEYS[6] outcome         the outcome key
-- KEYS[7] audit           the audit stream
-- KEYS[8] away            the away zset
-- ARGV[1] rid             request id
-- ARGV[2] entry           the stream entry id seen
-- ARGV[3] group
-- ARGV[4] result_ttl      result TTL ms
-- ARGV[5] audit_max       the audit's max length
-- ARGV[6] liveness_grace  the askers' liveness grace after a Redis start, ms
-- returns {'withdrawn', reason} | {'away', reason} | {'live'} | {'stale', state}
--   | {'moved', client id}: the hash names another asking process than KEYS[4] and KEYS[5] were built for (a keyed
--     ask re-attached); nothing was done: call again with that client's keys
-- The asker is the request hash's 'client' (and 'agent_fp'), never the stream entry's: the entry says who asked
-- first (docs/architecture.md). A hash naming no client ('') is a keyed ask whose asker detached: it stays away,
-- whatever the process that detached it does.
-- The asker is gone when its agent record expired (or another instance holds the id) or when its
-- process stopped refreshing its liveness key. As in deliver.lua, the outcome (CALLER_NOT_LIVE) is
-- written and a notice pushed to the asker's inbox even when its process looks dead: a process that
-- was only paused past its liveness TTL (GC, SIGSTOP) must not wait forever when it wakes; for a dead
-- one both keys lapse after the result TTL. A provider that showed the request gets a withdraw notice
-- on the stream. An entry whose request is missing or already settled is stale: it is removed; for
-- a missing one (expired after the request TTL, or lost in a failover) the asker, if it still waits,
-- is told BROKER_UNAVAILABLE, as deliver.lua does.
-- A keyed request is not withdrawn: its asker is marked away (as in deliver.lua), and a provider that
-- showed it gets a kind=away notice; an away asker found live again (a paused process that woke up)
-- is marked back, with a kind=back notice. Its detach grace is judged by away_end.lua.
-- The asking process is live while its field in the agent record ('p:<fingerprint>', agent_register.lua) has not
-- lapsed. A Redis restart that outlasted the liveness TTLs dropped live askers' keys with the dead ones': a request
-- asked before the server started is not judged by them ({'live'}) until it has been up for ARGV[6] ms (time for a
-- live asker to beat again).
local r = redis.call('HMGET', KEYS[1], 'state', 'entry', 'delivered', 'agent', 'agent_fp', 'key', 'grace', 'away',
  'client', 'created')
local client = r[9] or ''
if r[1] == 'pending' and client ~= '' and string.sub(KEYS[4], -#client - 1) ~= ':' .. client then
  return {'moved', client}
end
if not r[1] or r[1] ~= 'pending' then
  redis.pcall('XACK', KEYS[2], ARGV[3], ARGV[2])
  redis.call('XDEL', KEYS[2], ARGV[2])
  if not r[1] then
    local outcome = cjson.encode({error = {name = 'UserQuestionError', code = 'BROKER_UNAVAILABLE',
      message = 'request ' .. ARGV[1] .. ' is gone from Redis (expired after the request TTL, or lost in a failover)'}})
    redis.call('SET', KEYS[6], outcome, 'PX', ARGV[4])
    redis.call('RPUSH', KEYS[5], ARGV[1] .. ' ' .. outcome)
    redis.call('PEXPIRE', KEYS[5], ARGV[4])
  end
  return {'stale', r[1] or 'missing'}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local why = nil
if r[4] and r[4] ~= '' and tonumber(redis.call('HGET', KEYS[3], 'p:' .. (r[5] or '')) or '0') < now then
  why = 'the asking agent is no longer live'
elseif client == '' then
  why = 'the asker detached'
elseif redis.call('EXISTS', KEYS[4]) == 0 then
  why = 'the asking process stopped'
end
if why and asked_before_a_restart(r[10], now, ARGV[6]) then
  return {'live'}
end
if r[6] then
  if not why and r[8] then
    redis.call('HDEL', KEYS[1], 'away')
    redis.call('ZREM', KEYS[8], ARGV[1])
    if r[3] then
      redis.call('XADD', KEYS[2], '*', 'kind', 'back', 'rid', ARGV[1])
    end
    audit_append(KEYS[7], ARGV[5], 'event', 'back', 'rid', ARGV[1], 'by', 'housekeeping')
  elseif why and not r[8] then
    redis.call('HSET', KEYS[1], 'away', now)
    away_add(KEYS[8], ARGV[1], now, now + tonumber(r[7]), ARGV[4])
    if r[3] then
      redis.call('XADD', KEYS[2], '*', 'kind', 'away', 'rid', ARGV[1])
    end
    audit_append(KEYS[7], ARGV[5], 'event', 'away', 'rid', ARGV[1], 'reason', why,
      'by', 'housekeeping')
  end
  if why then
    return {'away', why}
  end
end
if not why then
  return {'live'}
end
redis.pcall('XACK', KEYS[2], ARGV[3], r[2])
redis.call('XDEL', KEYS[2], r[2])
if r[3] then
  redis.call('XADD', KEYS[2], '*', 'kind', 'withdraw', 'rid', ARGV[1], 'reason', 'withdrawn')
end
redis.call('HSET', KEYS[1], 'state', 'withdrawn', 'by', 'housekeeping')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[6], cjson.encode({error = {name = 'UserQuestionError', code = 'CALLER_NOT_LIVE',
  message = why}}), 'PX', ARGV[4])
redis.call('RPUSH', KEYS[5], ARGV[1])
redis.call('PEXPIRE', KEYS[5], ARGV[4])
audit_append(KEYS[7], ARGV[5], 'event', 'withdrawn', 'rid', ARGV[1], 'reason', why,
  'by', 'housekeeping')
return {'withdrawn', why}
