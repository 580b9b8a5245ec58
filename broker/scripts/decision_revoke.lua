#!lua
--! include _audit
-- decision_revoke: forget a remembered decision, by id.
-- KEYS[1] decisions  the decisions index (hash: id -> decision key)
-- KEYS[2] expiry     the decisions expiry (zset)
-- KEYS[3] audit      the audit stream
-- KEYS[4] decision   the decision key, as the index names it (read it with HGET first)
-- ARGV[1] id         decision id
-- ARGV[2] by         who revokes, for the audit
-- ARGV[3] audit_max  the audit's max length
-- returns {'ok'} revoked | {'gone'} no such decision (expired, revoked, replaced) | {'moved', key} the index names
--   another key for this id: call again with it
-- A retry after a lost reply finds it gone and changes nothing.
local key = redis.call('HGET', KEYS[1], ARGV[1])
if not key then
  return {'gone'}
end
if key ~= KEYS[4] then
  return {'moved', key}
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HGET', key, 'id') ~= ARGV[1] then
  return {'gone'}
end
local summary = redis.call('HGET', key, 'summary') or ''
redis.call('DEL', key)
audit_append(KEYS[3], ARGV[3], 'event', 'forgotten', 'decision', ARGV[1], 'by', ARGV[2],
  'summary', summary)
return {'ok'}
