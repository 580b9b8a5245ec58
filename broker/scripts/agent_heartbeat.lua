#!lua
--! include _agent_beat
-- agent_heartbeat: keep this process in its agent's record, or take it out; never once a restart superseded it.
-- KEYS[1] record      the agent record
-- KEYS[2] agents      the agents index (zset)
-- ARGV[1] fingerprint  the token's fingerprint
-- ARGV[2] ttl          TTL ms, or '0' to take this process out
-- ARGV[3] agent        agent id
-- ARGV[4] registered   when this process registered (agent_register's reply, Redis ms)
-- ARGV[5] owner        its owner id ('' for a root)
-- returns 1 while this process is one of the live instance's, 0 once a restart of the id superseded it
-- A process whose entry lapsed, or whose whole record did (a Redis restart that outlasted the TTL, a pause), is put
-- back: only a restart (agent_register.lua) supersedes a live process. The last process out removes the record.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local r = redis.call('HMGET', KEYS[1], 'restarted', 'owner', 'restarted_by')
local restarted = tonumber(r[1] or '-1')
local registered = tonumber(ARGV[4])
if restarted > registered or (restarted == registered and r[3] ~= ARGV[1]) or (r[2] and r[2] ~= ARGV[5]) then
  return 0
end
if ARGV[2] == '0' then
  redis.call('HDEL', KEYS[1], 'p:' .. ARGV[1])
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 2) == 'p:' and tonumber(fields[i + 1]) >= now then
      return 1
    end
  end
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[3])
  return 1
end
local ttl = tonumber(ARGV[2])
if not r[2] then
  redis.call('HSET', KEYS[1], 'owner', ARGV[5], 'since', t[1])
end
agent_beat(KEYS[1], KEYS[2], ARGV[1], ARGV[3], now, ttl)
return 1
