-- _away: an asker marked away, and the away zset's lifetime (deliver.lua, reap.lua, detach.lua).
-- Not a script of its own: a script that calls away_add includes it (a line '--! include _away', which
-- broker/_lua.py replaces with this code on one line); so no comment may follow code here.
-- away_add(away zset key, request id, now: Redis ms, when its grace ends: Redis ms, keep: ms)
-- Scores the request by when its grace ends. Without a maintenance worker nothing ends an away asker's grace: the
-- zset lapses keep ms (the result TTL) after the last grace it holds ends.
local function away_add(key, rid, now, ends, keep)
  redis.call('ZADD', key, ends, rid)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now) + tonumber(keep))
end
