#!lua
--! include _pending
-- withdraw: the asker goes away (abort, timeout, cancellation); the first terminal transition wins.
-- KEYS[1] request   the request hash
-- KEYS[2] requests  the requests stream
-- KEYS[3] asklog    the askers' log (qb:{NS}:asklog)
-- ARGV[1] rid       request id
-- ARGV[2] state     'withdrawn' | 'aborted' | 'timed_out' | 'expired'
-- ARGV[3] reason
-- ARGV[4] group
-- ARGV[5] log_max   the log's max length
-- returns {'ok'} | {'settled', state} | {'gone'}
-- The request hash is deleted: nobody waits for it any more. A provider that showed it gets
-- a withdraw notice on the stream so its UI takes the card down.
local r = redis.call('HMGET', KEYS[1], 'state', 'entry', 'delivered')
local ended = not_pending(r[1])
if ended then
  return ended
end
redis.call('DEL', KEYS[1])
redis.pcall('XACK', KEYS[2], ARGV[4], r[2])
redis.call('XDEL', KEYS[2], r[2])
if r[3] then
  redis.call('XADD', KEYS[2], '*', 'kind', 'withdraw', 'rid', ARGV[1], 'reason', ARGV[2])
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'event', ARGV[2], 'rid', ARGV[1], 'reason', ARGV[3])
return {'ok'}
