-- _kept: the lease kept across a Redis restart (lease_acquire.lua, lease_renew.lua). Not a script of its own: a script
-- that calls kept_lease includes it (a line '--! include _kept'); so no comment may follow code here.
-- The lease record ('<run id> <lease value>', PX 3 lease TTLs) is written with the lease and names the server run it
-- was written under. kept_lease(record key) returns the lease value a lapsed lease had, when that lease lapsed while
-- Redis restarted (the record names another run: the holder could not renew while the server was down), else nil.
local function kept_lease(record)
  if not record then
    return nil
  end
  local value = redis.call('GET', record)
  if not value then
    return nil
  end
  local run, lease = string.match(value, '^(%S+) (.*)$')
  local info = redis.pcall('INFO', 'server')
  local now_run = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or nil
  if not run or not now_run or run == now_run then
    return nil
  end
  return lease
end
local function record_lease(record, lease, ttl)
  if record then
    local info = redis.pcall('INFO', 'server')
    local run = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or '-'
    redis.call('SET', record, run .. ' ' .. lease, 'PX', 3 * tonumber(ttl))
  end
end
