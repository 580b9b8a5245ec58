-- _pending: what an asker's own request action replies when there is nothing left to do (withdraw.lua, detach.lua,
-- expire.lua). Not a script of its own: a script that calls not_pending includes it (a line '--! include _pending');
-- so no comment may follow code here.
-- not_pending(the request hash's state) returns {'gone'} when the hash is gone, {'settled', state} when the request
-- is no longer pending (the first terminal transition won: read the outcome), else nil.
local function not_pending(state)
  if not state then
    return {'gone'}
  end
  if state ~= 'pending' then
    return {'settled', state}
  end
  return nil
end
