-- release.lua: undo the charges of booked procs, driven by their per-proc
-- records, optionally as one checkpointed batch (one source transaction).
--
-- KEYS[1]  acct:seq
-- KEYS[2]  acct:sidecar:lsn     checkpoint: fixed-width (16) upper-case hex LSN
--
-- ARGV[1]  mode: "release" (the proc is gone: write a tombstone) or
--          "rollback" (the booking's proc INSERT failed: no tombstone, so a
--          recompute may still adopt the proc if the INSERT did commit)
-- ARGV[2]  LSN of the source transaction, or "" for no checkpoint
-- ARGV[3]  tombstone TTL in milliseconds (release mode; integer > 0)
-- ARGV[4..] proc ids
--
-- Record keys (acct:proc:{id}, acct:tomb:{id}, acct:procs:{show}) are built
-- here from the ids: single node / Sentinel only (see package lua).
--
-- Each show with a proc released here is published once on the channel
-- acct:released (the message is the show id): a scheduler whose cluster of
-- that show sleeps held back by a cap or burst looks again (package
-- scheduler/releases). A notice is a hint, never state: one that is lost
-- (or refused: a user without the channel) only leaves the cluster to its
-- sleep, and never fails the release.
--
-- Returns
--   {1, released, already_released, never_booked}  applied
--   {0, stored_lsn}                                 stale batch (LSN <= stored): nothing changed

local mode, lsn = ARGV[1], ARGV[2]
if mode ~= 'release' and mode ~= 'rollback' then
  return redis.error_reply('ERR acct release: mode must be "release" or "rollback", got "' .. tostring(mode) .. '"')
end
local ttl = tonumber(ARGV[3])
if mode == 'release' and (ttl == nil or ttl <= 0 or ttl ~= math.floor(ttl)) then
  return redis.error_reply('ERR acct release: tombstone TTL must be a positive integer of milliseconds, got ' .. tostring(ARGV[3]))
end
if lsn == nil then lsn = '' end
if lsn ~= '' and (#lsn ~= 16 or not string.match(lsn, '^[0-9A-F]+$')) then
  return redis.error_reply('ERR acct release: LSN must be 16 upper-case hex digits, got "' .. lsn .. '"')
end
for i = 4, #ARGV do
  if ARGV[i] == '' then return redis.error_reply('ERR acct release: empty proc id at position ' .. (i - 3)) end
end

if lsn ~= '' then
  local last = redis.call('GET', KEYS[2])
  if last and last >= lsn then return {0, last} end
end

local released, dup, unknown = 0, 0, 0
local shows, notify = {}, {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local rk = 'acct:proc:' .. id
  local tk = 'acct:tomb:' .. id
  local r = redis.call('HMGET', rk, 'show', 'sub', 'folder', 'job', 'layer', 'point', 'cores', 'gpus', 'rg', 'host', 'seats')
  if r[1] then
    local c, g = -(tonumber(r[7]) or 0), -(tonumber(r[8]) or 0)
    -- Counted by the show's running repair: take it out of the sums too.
    local rep = r[9] and redis.call('HGET', 'acct:rep:' .. r[1], 'gen') == r[9]
    for j = 2, 6 do
      if r[j] then
        redis.call('HINCRBY', r[j], 'int_cores', string.format('%d', c))
        redis.call('HINCRBY', r[j], 'int_gpus', string.format('%d', g))
        if rep then
          redis.call('HINCRBY', 'acct:repc:' .. r[1], r[j], string.format('%d', c))
          redis.call('HINCRBY', 'acct:repg:' .. r[1], r[j], string.format('%d', g))
        end
      end
    end
    -- Node-locked limits: the host's seat goes when its last proc of the
    -- limit does (the record is deleted below, so this runs once).
    if r[10] and r[11] then
      for lim in string.gmatch(r[11], '[^,]+') do
        local sk = 'acct:seat:' .. lim
        if redis.call('HINCRBY', sk, r[10], -1) <= 0 then redis.call('HDEL', sk, r[10]) end
      end
    end
    redis.call('DEL', rk)
    redis.call('SREM', 'acct:procs:' .. r[1], id)
    if not shows[r[1]] then
      shows[r[1]] = true
      notify[#notify + 1] = r[1]
    end
    redis.call('INCR', KEYS[1])
    released = released + 1
  elseif mode == 'release' and redis.call('EXISTS', tk) == 1 then
    dup = dup + 1
  else
    unknown = unknown + 1
  end
  if mode == 'release' then
    redis.call('SET', tk, '1', 'PX', ttl)
  end
end
if lsn ~= '' then redis.call('SET', KEYS[2], lsn) end
-- pcall: an ACL user without the channel (Redis 7 users start with
-- resetchannels) gets no notices, but its releases still apply.
for _, sh in ipairs(notify) do redis.pcall('PUBLISH', 'acct:released', sh) end
return {1, released, dup, unknown}
