-- limits.lua: write cap fields, in WAL order. Caps reach Redis from two
-- writers: the sidecar, as each transaction that changes them commits
-- (stamped with its commit's end LSN), and the leader's limit reseed, from a
-- Postgres snapshot (stamped with the WAL position read just before it). A
-- hash remembers the position its caps are valid at (cap_lsn); a write
-- stamped earlier than that is skipped, so a reseed whose snapshot predates
-- a cap change the sidecar already wrote cannot put the old cap back.
--
-- KEYS[i]  the hashes (acct:sub / folder / job / point)
-- ARGV[1]  the stamp, an LSN as fixed-width upper-case hex (16 digits), or
--          "" for an unordered write (tools, tests): written, stamp untouched
-- then, for each key in order: n (the number of field/value pairs), then n
-- pairs.
-- Returns {written, skipped}.
local stamp = ARGV[1]
if type(stamp) ~= 'string' or (stamp ~= '' and not string.match(stamp, '^%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x$')) then
  return redis.error_reply('limits: bad stamp ' .. tostring(stamp))
end
-- Validate everything before the first write (a script is not rolled back).
local pos, spans = 2, {}
for i = 1, #KEYS do
  local n = tonumber(ARGV[pos])
  if not n or n < 1 or n ~= math.floor(n) or pos + 2 * n > #ARGV then
    return redis.error_reply('limits: bad field count for ' .. KEYS[i])
  end
  spans[i] = {pos + 1, pos + 2 * n}
  pos = pos + 2 * n + 1
end
if pos ~= #ARGV + 1 then
  return redis.error_reply('limits: trailing arguments')
end
local written, skipped = 0, 0
for i = 1, #KEYS do
  local key = KEYS[i]
  local stored = (stamp ~= '') and redis.call('HGET', key, 'cap_lsn') or false
  if stored and stored > stamp then
    skipped = skipped + 1
  else
    local args = {}
    for j = spans[i][1], spans[i][2] do args[#args + 1] = ARGV[j] end
    if stamp ~= '' then
      args[#args + 1] = 'cap_lsn'
      args[#args + 1] = stamp
    end
    redis.call('HSET', key, unpack(args))
    written = written + 1
  end
end
return {written, skipped}
