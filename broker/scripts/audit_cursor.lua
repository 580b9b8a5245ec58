#!lua
-- audit_cursor: advance the maintenance workers' shared audit-stream cursor, only from where it was read.
-- KEYS[1] cursor     the cursor key
-- ARGV[1] read_from  the cursor the caller read from ('' when there was none)
-- ARGV[2] to         the new cursor (an entry id)
-- returns 1 when advanced (the caller counts the events in between), 0 when another worker moved it first
-- Compare-and-set, so that of several workers each audit event is counted exactly once.
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
