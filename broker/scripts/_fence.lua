-- _fence: the lease check every fenced provider action starts with (deliver.lua, settle.lua, approve.lua,
-- notice_ack.lua). Not a script of its own: a script that calls lease_lost includes it (a line '--! include _fence');
-- so no comment may follow code here.
-- lease_lost(lease key, fence '<epoch>:<token>:') returns the LEASE_LOST refusal unless the lease is held under
-- exactly that fence, else nil. The token counts as well as the epoch: a holder given the same epoch after a
-- failover is another holder (invariant 2).
local function lease_lost(key, fence)
  local lease = redis.call('GET', key)
  if not lease or fence == '' or string.sub(lease, 1, #fence) ~= fence then
    return {'err', 'LEASE_LOST', 'this provider no longer holds the lease'}
  end
  return nil
end
