#!lua
-- settled_cleanup: an asking process has the outcomes of these requests (their ask calls returned): their keys go.
-- KEYS: settled, two per request i = 0, 1, ...: KEYS[1 + 2i] its request hash, KEYS[2 + 2i] its outcome key
-- ARGV[1] tombstone  how long the tombstone outlives this, ms (TOMBSTONE_MS, 60 s)
-- ARGV[2] client     the cleaning process's client id: a request whose hash names another client is left alone
-- ARGV[3] unclaimed  'unclaimed' when no ask of this process received these outcomes (a notice nobody here waits
--                    for): a keyed request is then left alone, whatever its hash names, for the asker that re-attaches
--                    to it (it is collected then, or ends by its TTL or away_end.lua); absent: the ask calls returned
--                    with these outcomes
-- returns the number of requests cleaned up
-- The rule: an outcome goes only once its asker received it (its ask call returned with it), or when no asker can
-- ever collect it (an unkeyed ask that ended without it). Never for a keyed ask its process stopped waiting on.
-- For every request the asker resolved in one tick: the outcome goes, and a settled request's hash becomes a
-- tombstone for the tombstone time that keeps only what a retry reads: 'state', 'settle_call' and 'by' (a
-- provider's settle.lua retried after a lost reply recognises its own settlement instead of getting NOT_PENDING)
-- and 'client' (this script retried). It is written anew rather than trimmed: a hash that once held the request
-- body stays in Redis's large encoding (about 870 B) however many fields leave it; written anew it takes about
-- 220 B, which matters at thousands of asks a second. A hash still pending only drops its request body.
-- A keyed request that another process re-attached to is that process's to collect. Idempotent: safe to
-- retry after a lost reply.
local cleaned = 0
for i = 1, #KEYS, 2 do
  local r = redis.call('HMGET', KEYS[i], 'client', 'state', 'settle_call', 'by', 'key')
  if (not r[1] or r[1] == ARGV[2]) and not (r[5] and ARGV[3] == 'unclaimed') then
    if r[2] and r[2] ~= 'pending' then
      local kept = {'state', r[2]}
      if r[1] then kept[#kept + 1] = 'client'; kept[#kept + 1] = r[1] end
      if r[3] then kept[#kept + 1] = 'settle_call'; kept[#kept + 1] = r[3] end
      if r[4] then kept[#kept + 1] = 'by'; kept[#kept + 1] = r[4] end
      -- the outcome goes in the same command (one Redis command per ask less: docs/benchmarks-budget.md)
      redis.call('DEL', KEYS[i], KEYS[i + 1])
      redis.call('HSET', KEYS[i], unpack(kept))
    else
      redis.call('UNLINK', KEYS[i + 1])
      redis.call('HDEL', KEYS[i], 'request')
    end
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    cleaned = cleaned + 1
  end
end
return cleaned
