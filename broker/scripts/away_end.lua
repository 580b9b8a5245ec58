#!lua
--! include _audit
-- away_end: end a keyed request whose asker stayed away past its detach grace (housekeeping).
-- KEYS[1] request    the request hash
-- KEYS[2] requests   the requests stream
-- KEYS[3] outcome    the outcome key
-- KEYS[4] away       the away zset
-- KEYS[5] audit      the audit stream
-- KEYS[6] durable    the request's durable key (of the hash's 'agent' and 'key'; absent: left to its TTL)
-- ARGV[1] rid        request id
-- ARGV[2] group
-- ARGV[3] audit_max  the audit's max length
-- returns {'expired', 'pending'} | {'uncollected', state} | {'waiting', ms left} | {'back'} | {'collected'} | {'gone'}
-- Pending and still away when the grace ends: the request ends as expired (a provider that showed
-- it gets a withdraw notice). Answered or cancelled while away and not collected by a re-attach:
-- the outcome is kept while its key lives (settle.lua keeps it for the longer of the result TTL and
-- the grace), then its keys go, audited as 'uncollected': not a second end (settle.lua audited the
-- one it had), so a digest of the audit counts each request once. An asker that came back, or
-- collected its outcome, just leaves the away zset. Idempotent.
-- Ending the request (expired or uncollected) releases its durable key when it still names it: a re-attach would
-- ask anew, and the key would otherwise outlive the request by its own TTL, 2 x the request TTL + the grace.
local function release()
  if KEYS[6] and redis.call('GET', KEYS[6]) == ARGV[1] then
    redis.call('DEL', KEYS[6])
  end
end
local score = redis.call('ZSCORE', KEYS[4], ARGV[1])
if not score then
  return {'gone'}
end
local r = redis.call('HMGET', KEYS[1], 'state', 'entry', 'delivered', 'away', 'request')
if not r[1] then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return {'gone'}
end
if not r[4] then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return {'back'}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if tonumber(score) > now then
  return {'waiting', tonumber(score) - now}
end
if r[1] == 'pending' then
  local message = 'the asker did not come back within its detach grace'
  redis.call('HSET', KEYS[1], 'state', 'expired', 'by', 'housekeeping')
  redis.call('HDEL', KEYS[1], 'request')
  redis.call('PEXPIRE', KEYS[1], 60000)
  redis.pcall('XACK', KEYS[2], ARGV[2], r[2])
  redis.call('XDEL', KEYS[2], r[2])
  if r[3] then
    redis.call('XADD', KEYS[2], '*', 'kind', 'withdraw', 'rid', ARGV[1], 'reason', 'expired')
  end
  redis.call('ZREM', KEYS[4], ARGV[1])
  release()
  audit_append(KEYS[5], ARGV[3], 'event', 'expired', 'rid', ARGV[1], 'reason', message,
    'by', 'housekeeping')
  return {'expired', 'pending'}
end
if not r[5] then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return {'collected'}
end
local left = redis.call('PTTL', KEYS[3])
if left > 0 then
  redis.call('ZADD', KEYS[4], now + left, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], left + 60000) -- to be here, for the audit, when the outcome lapses
  return {'waiting', left}
end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
release()
audit_append(KEYS[5], ARGV[3], 'event', 'uncollected', 'rid', ARGV[1],
  'reason', 'the ' .. r[1] .. ' outcome was not collected: the asker did not come back', 'by', 'housekeeping')
return {'uncollected', r[1]}
