#!lua
--! include _pending
--! include _away
-- detach: a keyed ask's caller stops waiting without giving the question up (its task was cancelled, or
-- its broker closed); the request stays pending, its asker away, for its detach grace.
-- KEYS[1] request     the request hash
-- KEYS[2] requests    the requests stream
-- KEYS[3] away        the away zset
-- KEYS[4] asklog      the askers' log (qb:{NS}:asklog)
-- ARGV[1] rid         request id
-- ARGV[2] client      the detaching process's client id
-- ARGV[3] log_max     the log's max length
-- ARGV[4] result_ttl  result TTL ms (the away zset lapses that long after the last grace it holds ends; absent: 0)
-- returns {'ok'} | {'settled', state} (read the outcome) | {'gone'} | {'other'} (another process re-attached)
-- The hash's 'client' becomes '' (nobody waits): housekeeping and a provider then see the asker away however
-- long the detaching process runs on, and nothing it receives later cleans the request up (docs/architecture.md).
-- Idempotent: a retry after a lost reply finds the asker already detached and changes nothing.
local r = redis.call('HMGET', KEYS[1], 'state', 'client', 'away', 'delivered', 'grace')
local ended = not_pending(r[1])
if ended then
  return ended
end
if r[2] ~= ARGV[2] and not (r[2] == '' and r[3]) then
  return {'other'}
end
redis.call('HSET', KEYS[1], 'client', '')
if r[3] then
  return {'ok'}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('HSET', KEYS[1], 'away', now)
away_add(KEYS[3], ARGV[1], now, now + tonumber(r[5] or '0'), ARGV[4] or '0')
if r[4] then
  redis.call('XADD', KEYS[2], '*', 'kind', 'away', 'rid', ARGV[1])
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', 'event', 'away', 'rid', ARGV[1],
  'reason', 'the asker detached', 'client', ARGV[2])
return {'ok'}
