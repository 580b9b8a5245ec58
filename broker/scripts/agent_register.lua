#!lua
--! include _agent_beat
-- agent_register: add this process to its agent id's record, or (a restart) start a new instance of the id.
-- KEYS[1] record        the agent record
-- KEYS[2] owner_record  the owner's record (the agent record when no owner)
-- KEYS[3] agents        the agents index (zset)
-- ARGV[1] fingerprint   the token's fingerprint
-- ARGV[2] owner         owner id ('' for a root)
-- ARGV[3] ttl           TTL ms
-- ARGV[4] check_owner   '1' when an owner is named and must be live
-- ARGV[5] agent         agent id
-- ARGV[6] mode          'restart' to start a new instance: every process registered before is superseded; else join
-- returns {'ok', when this process registered (Redis ms)} | {'err', 'CALLER_NOT_LIVE', message}
-- The record is the live instance: 'owner', 'since' (unix s), 'restarted' and 'restarted_by' (Redis ms of its start
-- by a restart, and that process's fingerprint; absent when it began with a join) and one field per live process,
-- 'p:<fingerprint>' = when that process lapses (unix ms).
-- The processes of an agent (several shell steps, several workers) join it and ask at once; none supersedes another.
-- Registering under another owner starts a new instance too: ownership at run time decides (DESIGN.md Part 1).
-- The record lives as long as its longest-lived process. The index lists the namespace's agents by expiry (unix ms),
-- so a status read needs no SCAN.
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[2]) == 0 then
  return {'err', 'CALLER_NOT_LIVE', 'owner ' .. ARGV[2] .. ' is not a live agent'}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ttl = tonumber(ARGV[3])
local owner = redis.call('HGET', KEYS[1], 'owner')
if ARGV[6] == 'restart' or not owner or owner ~= ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'since', t[1])
  if owner or ARGV[6] == 'restart' then
    redis.call('HSET', KEYS[1], 'restarted', now, 'restarted_by', ARGV[1])
  end
else
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 2) == 'p:' and tonumber(fields[i + 1]) < now then
      redis.call('HDEL', KEYS[1], fields[i])
    end
  end
end
agent_beat(KEYS[1], KEYS[3], ARGV[1], ARGV[5], now, ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
return {'ok', tostring(now)}
