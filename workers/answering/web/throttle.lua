#!lua
-- throttle: failed-attempt counters for sign-in and bearer tokens, one fixed window per counter.
-- KEYS[1..n] counters (qb:{ns}:web:throttle:<kind>:<digest>), all of one namespace (one slot)
-- ARGV[1] mode: 'take' | 'give' | 'check' | 'fail'   ARGV[2] window ms   ARGV[3..n+2] each counter's limit
-- 'take'  counts an attempt on every counter unless one is at its limit (then counts nothing);
-- 'give'  gives back an attempt that 'take' counted (the attempt succeeded);
-- 'check' counts nothing; 'fail' counts a failure on every counter.
-- returns 0 when allowed (or for 'give' / 'fail'), else the ms until the fullest counter resets
-- Counters only expire (PX set when a counter is created): a crash leaves nothing behind for good.
local mode, window = ARGV[1], tonumber(ARGV[2])
if mode == 'take' or mode == 'check' then
  local wait = 0
  for i, key in ipairs(KEYS) do
    local count = tonumber(redis.call('GET', key) or '0')
    if count >= tonumber(ARGV[i + 2]) then
      local left = redis.call('PTTL', key)
      if left < 1 then left = window end
      if left > wait then wait = left end
    end
  end
  if wait > 0 or mode == 'check' then
    return wait
  end
end
for _, key in ipairs(KEYS) do
  if mode == 'give' then
    if redis.call('EXISTS', key) == 1 and tonumber(redis.call('GET', key)) > 0 then
      redis.call('DECR', key)
    end
  elseif redis.call('INCR', key) == 1 then
    redis.call('PEXPIRE', key, window)
  end
end
return 0
