#!lua
--! include _pending
--! include _audit
-- expire: settle a pending request whose deadline passed with ASK_TIMED_OUT (housekeeping).
-- KEYS[1] request     the request hash
-- KEYS[2] requests    the requests stream
-- KEYS[3] outcome     the outcome key
-- KEYS[4] inbox       the asker's inbox
-- KEYS[5] audit       the audit stream
-- KEYS[6] durable     a keyed request's durable key (absent: not known yet)
-- ARGV[1] rid         request id
-- ARGV[2] group
-- ARGV[3] result_ttl  result TTL ms
-- ARGV[4] audit_max   the audit's max length
-- returns {'expired', client id still to be told or ''} | {'waiting', ms left} | {'no-deadline'} | {'settled', state}
--   | {'gone'} | {'keyed', agent id, key}: a keyed request past its deadline and no KEYS[6]: nothing was done; call
--   again with the durable key of that agent id and key
-- A keyed request's durable key is released (when it still names this request): a re-attach would ask anew, and
-- the key would otherwise outlive the request by its own TTL, 2 x the request TTL + the grace (issue 23, case 11).
-- The deadline is judged by the Redis clock. The first terminal transition wins, as in settle.lua:
-- the outcome goes to the per-request key and a notice to the asker's inbox; a provider that
-- showed the request gets a withdraw notice on the stream so its UI takes the card down. The notice goes only to
-- the asking process the hash names (KEYS[4] is its inbox, or the caller's view is stale, or a keyed asker detached):
-- any other asker finds the outcome by its sweep, or on re-attaching.
local r = redis.call('HMGET', KEYS[1], 'state', 'entry', 'delivered', 'deadline', 'client', 'key', 'agent')
local ended = not_pending(r[1])
if ended then
  return ended
end
local deadline = tonumber(r[4] or '')
if not deadline then
  return {'no-deadline'}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if deadline > now then
  return {'waiting', deadline - now}
end
if r[6] and not KEYS[6] then
  return {'keyed', r[7] or '', r[6]}
end
local message = 'nobody answered before the deadline'
redis.call('HSET', KEYS[1], 'state', 'expired', 'by', 'housekeeping')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[3], cjson.encode({error = {name = 'UserQuestionError', code = 'ASK_TIMED_OUT',
  message = message}}), 'PX', ARGV[3])
redis.pcall('XACK', KEYS[2], ARGV[2], r[2])
redis.call('XDEL', KEYS[2], r[2])
if r[6] and redis.call('GET', KEYS[6]) == ARGV[1] then
  redis.call('DEL', KEYS[6])
end
if r[3] then
  redis.call('XADD', KEYS[2], '*', 'kind', 'withdraw', 'rid', ARGV[1], 'reason', 'expired')
end
local client = r[5] or ''
if client ~= '' and string.sub(KEYS[4], -#client - 1) == ':' .. client then
  redis.call('RPUSH', KEYS[4], ARGV[1])
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
  client = ''
end
audit_append(KEYS[5], ARGV[4], 'event', 'expired', 'rid', ARGV[1], 'reason', message,
  'by', 'housekeeping')
if client ~= '' then
  return {'expired', client}
end
return {'expired'}
