-- reconcile.lua: bring one bounded batch of one show's per-proc records in
-- line with a Postgres snapshot of its procs. Every change moves the counters
-- by exactly the record's amounts, so "counter = sum of the records charging
-- it" holds before and after. See package lua for the rules.
--
-- KEYS[1]  acct:seq
-- KEYS[2]  acct:procs:{show}
-- KEYS[3]  acct:rep:{show}   repair session of the show, if any (see repair.lua)
-- KEYS[4]  acct:repc:{show}
-- KEYS[5]  acct:repg:{show}
--
-- ARGV[1]  show id
-- ARGV[2]  seq0: acct:seq read before the snapshot was taken
-- ARGV[3]  t0: Redis time (ms) read before the snapshot was taken
-- ARGV[4]  in-flight grace (ms): a record younger than t0 - grace is never dropped
-- ARGV[5]  max snapshot age (ms): refuse the batch when now - t0 exceeds it
--          (it must stay below the tombstone TTL, or a release tombstone could
--          expire before this batch consults it)
-- ARGV[6]  live backends: "-" when unknown, else the pids of every
--          PostgreSQL backend, comma-separated, read after seq0 and t0 and
--          before the snapshot. A record booked before seq0 whose "pid"
--          (the backend its transaction runs on) is not among them is
--          orphaned: that connection is gone, so its transaction ended
--          before the snapshot began (committed, so the snapshot would have
--          its proc, or never); it is dropped without waiting for the grace
-- ARGV[7]  n: number of present entries that follow
-- ARGV[8 .. 7+9n]  present entries, 9 fields each:
--          proc, sub key, folder key, job key, layer key, point key,
--          whole cores, centicores, gpus
-- ARGV[8+9n ..]    drop candidates: proc ids with a record but absent from the snapshot
--
-- Returns
--   {1, adopted, retargeted, dropped, skipped_released, kept_inflight,
--    drift_sub, drift_folder, drift_job, drift_layer, drift_point,
--    dropped_orphaned (of dropped: by the live-backend rule, before the grace)}
--   {-1, age_ms}  the snapshot is too old; nothing changed
--   {-2, seq}     acct:seq is below seq0: Redis went back in time since the
--                 mark (restarted from an older snapshot, a failover to a
--                 replica that missed writes); nothing changed. Adopting
--                 procs now would raise acct:seq back over the writes it
--                 lost and hide the rollback from every scheduler's watch.

local show = ARGV[1]
local seq0, t0, grace, maxage, n = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[7])
local live = nil
if ARGV[6] ~= nil and ARGV[6] ~= '-' then
  live = {}
  for pid in string.gmatch(ARGV[6], '%d+') do live[pid] = true end
end
if show == nil or show == '' then return redis.error_reply('ERR acct reconcile: empty show id') end
if not seq0 or not t0 or not grace or not maxage or not n or n < 0 or n ~= math.floor(n) then
  return redis.error_reply('ERR acct reconcile: seq0, t0, grace, max age and n must be numbers')
end
local first_drop = 8 + 9 * n
if #ARGV < first_drop - 1 then
  return redis.error_reply('ERR acct reconcile: ' .. n .. ' present entries need ' .. (9 * n) .. ' arguments, got ' .. (#ARGV - 7))
end
for i = 0, n - 1 do
  local b = 8 + 9 * i
  for k = b, b + 5 do
    if ARGV[k] == '' then return redis.error_reply('ERR acct reconcile: empty id or key in entry ' .. (i + 1)) end
  end
  for k = b + 6, b + 8 do
    local v = tonumber(ARGV[k])
    if v == nil or v < 0 or v ~= math.floor(v) then
      return redis.error_reply('ERR acct reconcile: entry ' .. (i + 1) .. ' (' .. ARGV[b] .. '): amounts must be non-negative integers')
    end
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now - t0 > maxage then return {-1, now - t0} end
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if cur < seq0 then return {-2, cur} end

local drift = {0, 0, 0, 0, 0}
local adopted, retargeted, dropped, skipped, kept, orphaned = 0, 0, 0, 0, 0, 0
local gen = redis.call('HGET', KEYS[3], 'gen')

-- move adds c cores and g GPUs to key's counter, and to the running repair's
-- sums when the record is counted by it (counted = its rg is the session's).
local function move(key, c, g, counted)
  redis.call('HINCRBY', key, 'int_cores', string.format('%d', c))
  redis.call('HINCRBY', key, 'int_gpus', string.format('%d', g))
  if counted then
    redis.call('HINCRBY', KEYS[4], key, string.format('%d', c))
    redis.call('HINCRBY', KEYS[5], key, string.format('%d', g))
  end
end

for i = 0, n - 1 do
  local b = 8 + 9 * i
  local id = ARGV[b]
  local keys = {ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]}
  local c, centi, g = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]), tonumber(ARGV[b + 8])
  local rk = 'acct:proc:' .. id
  local r = redis.call('HMGET', rk, 'sub', 'folder', 'job', 'layer', 'point', 'cores', 'gpus', 'centi', 'rg')
  if r[1] then
    -- Booked through Redis and committed: the snapshot is the truth about
    -- where it is charged now (a job moved folder, a host changed alloc).
    local oc, og = tonumber(r[6]) or 0, tonumber(r[7]) or 0
    local changed = (oc ~= c or og ~= g or tonumber(r[8]) ~= centi)
    for j = 1, 5 do
      if r[j] ~= keys[j] then changed = true end
    end
    if changed then
      local counted = gen ~= false and r[9] == gen
      for j = 1, 5 do
        if r[j] ~= keys[j] or oc ~= c or og ~= g then
          if r[j] then move(r[j], -oc, -og, counted) end
          move(keys[j], c, g, counted)
          if r[j] ~= keys[j] then drift[j] = drift[j] + oc + c else drift[j] = drift[j] + math.abs(c - oc) end
        end
      end
      redis.call('HSET', rk, 'sub', keys[1], 'folder', keys[2], 'job', keys[3], 'layer', keys[4], 'point', keys[5],
        'cores', ARGV[b + 6], 'centi', ARGV[b + 7], 'gpus', ARGV[b + 8])
      redis.call('INCR', KEYS[1])
      retargeted = retargeted + 1
    end
  elseif redis.call('EXISTS', 'acct:tomb:' .. id) == 1 then
    -- Released after the snapshot was taken: adopting it would charge a
    -- proc that no longer exists.
    skipped = skipped + 1
  else
    -- In Postgres, unknown to Redis: booked by Cuebot before the show was
    -- managed, or a booking whose rollback raced an INSERT that committed.
    for j = 1, 5 do move(keys[j], c, g, gen ~= false) end
    local seq = redis.call('INCR', KEYS[1])
    redis.call('HSET', rk, 'show', show, 'sub', keys[1], 'folder', keys[2], 'job', keys[3], 'layer', keys[4],
      'point', keys[5], 'cores', ARGV[b + 6], 'centi', ARGV[b + 7], 'gpus', ARGV[b + 8],
      'seq', string.format('%d', seq), 'ts', string.format('%d', now), 'origin', 'adopt')
    if gen then redis.call('HSET', rk, 'rg', gen) end
    redis.call('SADD', KEYS[2], id)
    adopted = adopted + 1
    for j = 1, 5 do drift[j] = drift[j] + c end
  end
end

for i = first_drop, #ARGV do
  local id = ARGV[i]
  local rk = 'acct:proc:' .. id
  local r = redis.call('HMGET', rk, 'sub', 'folder', 'job', 'layer', 'point', 'cores', 'gpus', 'show', 'seq', 'ts', 'rg', 'pid', 'host', 'seats')
  if not r[8] then
    redis.call('SREM', KEYS[2], id) -- dangling member
  elseif r[8] == show then
    local seq, ts = tonumber(r[9]) or 0, tonumber(r[10]) or 0
    local gone = live ~= nil and r[12] and not live[r[12]]
    if seq < seq0 and (ts < t0 - grace or gone) then
      -- Booked well before the snapshot began (or on a connection that is
      -- gone) and still not visible to it: its INSERT never committed (a
      -- crash between Lua and INSERT, a database promoted under it) or its
      -- release never reached Redis. Either way it holds nothing.
      if ts >= t0 - grace then orphaned = orphaned + 1 end
      local c, g = tonumber(r[6]) or 0, tonumber(r[7]) or 0
      local counted = gen ~= false and r[11] == gen
      for j = 1, 5 do
        if r[j] then
          move(r[j], -c, -g, counted)
          drift[j] = drift[j] + c
        end
      end
      if r[13] and r[14] then
        for lim in string.gmatch(r[14], '[^,]+') do
          local sk = 'acct:seat:' .. lim
          if redis.call('HINCRBY', sk, r[13], -1) <= 0 then redis.call('HDEL', sk, r[13]) end
        end
      end
      redis.call('DEL', rk)
      redis.call('SREM', KEYS[2], id)
      redis.call('INCR', KEYS[1])
      dropped = dropped + 1
    else
      kept = kept + 1 -- possibly in flight: never erased
    end
  end
end

return {1, adopted, retargeted, dropped, skipped, kept, drift[1], drift[2], drift[3], drift[4], drift[5], orphaned}
