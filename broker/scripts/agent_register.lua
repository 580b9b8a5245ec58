#!lua
-- agent_register: make this instance the live holder of an agent id (a newer instance replaces an older).
-- KEYS[1] agent record   ARGV[1] token fingerprint   ARGV[2] owner id ('' for a root)   ARGV[3] TTL ms
-- ARGV[4] owner's record key check: '1' when an owner is named and must be live
-- KEYS[2] owner's record (the agent record when no owner)   KEYS[3] the agents index (zset)   ARGV[5] agent id
-- returns {'ok'} | {'err', 'CALLER_NOT_LIVE', message}
-- The index lists the namespace's agents by expiry (unix ms), so a status read needs no SCAN.
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[2]) == 0 then
  return {'err', 'CALLER_NOT_LIVE', 'owner ' .. ARGV[2] .. ' is not a live agent'}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'owner', ARGV[2], 'since', t[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
return {'ok'}
