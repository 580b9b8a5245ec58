#!lua
--! include _audit
-- deadletter: move a poison stream entry aside, with the reason, and fail its request if there is one.
-- KEYS[1] requests    the requests stream
-- KEYS[2] dead        the dead-letter stream
-- KEYS[3] request     the request hash (the dead-letter stream when none)
-- KEYS[4] outcome     the outcome key (idem)
-- KEYS[5] inbox       the asker's inbox (idem)
-- KEYS[6] audit       the audit stream
-- ARGV[1] entry       entry id
-- ARGV[2] reason
-- ARGV[3] group
-- ARGV[4] dead_max    the dead-letter stream's max length
-- ARGV[5] result_ttl  result TTL ms
-- ARGV[6] rid         request id ('' when unknown)
-- ARGV[7] audit_max   the audit's max length
-- ARGV[8] fields      the entry's fields as JSON
-- returns {'ok'}
-- A retry after a lost reply finds the entry gone from the stream and writes nothing again.
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return {'ok'}
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'entry', ARGV[1], 'reason', ARGV[2], 'fields', ARGV[8])
redis.pcall('XACK', KEYS[1], ARGV[3], ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
if ARGV[6] ~= '' and redis.call('HGET', KEYS[3], 'state') == 'pending' then
  redis.call('HSET', KEYS[3], 'state', 'failed')
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
  local outcome = cjson.encode({error = {name = 'UserQuestionError', code = 'BAD_REQUEST', message = ARGV[2]}})
  redis.call('SET', KEYS[4], outcome, 'PX', ARGV[5])
  redis.call('RPUSH', KEYS[5], ARGV[6] .. ' ' .. outcome)
  redis.call('PEXPIRE', KEYS[5], ARGV[5])
end
audit_append(KEYS[6], ARGV[7], 'event', 'dead-lettered', 'rid', ARGV[6], 'reason', ARGV[2])
return {'ok'}
