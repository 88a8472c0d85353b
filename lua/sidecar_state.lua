-- sidecar_state.lua: save the sidecar's managed-show set unless the stored
-- one is at least as new. See package lua and package sidecar.
--
-- KEYS[1]  acct:sidecar:shows   "<%016X LSN>\n<show id>\n<show id>..."
--
-- ARGV[1]  the new value; its first 16 characters are the LSN it is valid
--          at (fixed-width upper-case hex, compared as a string)
-- ARGV[2]  "force" overwrites whatever is stored (a new slot, possibly on
--          another timeline); anything else keeps a stored value whose LSN
--          is at least ARGV[1]'s
--
-- Returns 1 written, 0 kept (the stored value is as new or newer).

local cur = redis.call('GET', KEYS[1])
if ARGV[2] ~= 'force' and cur and string.sub(cur, 1, 16) >= string.sub(ARGV[1], 1, 16) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
