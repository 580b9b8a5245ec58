#!lua
-- agent_heartbeat: keep the record alive, or remove it, only while this instance holds it.
-- KEYS[1] agent record   KEYS[2] the agents index (zset)
-- ARGV[1] token fingerprint   ARGV[2] TTL ms, or '0' to remove the record   ARGV[3] agent id
-- returns 1 while this instance is the live one, 0 once it is not
if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[1] then
  return 0
end
if ARGV[2] == '0' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[3])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[2]), ARGV[3])
end
return 1
