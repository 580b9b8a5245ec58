#!lua
-- settled_cleanup: an asking process has the outcomes of these requests (their ask calls returned): their keys go.
-- KEYS: two per request, from KEYS[1 + 2i] for request i = 0, 1, ...: request hash, outcome key
-- ARGV[1] how long the slim hash outlives this, ms (TOMBSTONE_MS, 60 s)
-- ARGV[2] the cleaning process's client id: a request whose hash names another client is left alone
-- returns the number of requests cleaned up
-- For every request the asker resolved in one tick: the outcome goes; the hash drops its request body
-- and keeps its bookkeeping fields (state, settle call id, ...) for the tombstone time, so that a provider's settle retried
-- after a lost reply still recognises its own settlement instead of getting NOT_PENDING. A keyed
-- request that another process re-attached to is that process's to collect. Idempotent: safe to
-- retry after a lost reply.
local cleaned = 0
for i = 1, #KEYS, 2 do
  local client = redis.call('HGET', KEYS[i], 'client')
  if not client or client == ARGV[2] then
    redis.call('UNLINK', KEYS[i + 1])
    redis.call('HDEL', KEYS[i], 'request')
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    cleaned = cleaned + 1
  end
end
return cleaned
