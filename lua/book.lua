-- book.lua: charge one proc's reservation to the five accounting hashes,
-- atomically, after checking the caps. See package lua for the contract.
--
-- KEYS[1]  acct:sub:{show}:{alloc}
-- KEYS[2]  acct:folder:{folder}
-- KEYS[3]  acct:job:{job}
-- KEYS[4]  acct:layer:{layer}
-- KEYS[5]  acct:point:{dept}:{show}
-- KEYS[6]  acct:seq
-- KEYS[7]  acct:proc:{proc}         per-proc booking record (idempotency)
-- KEYS[8]  acct:show:{show}         seeding marker (field "seeded")
-- KEYS[9]  acct:procs:{show}        set of the show's booked proc ids
-- KEYS[10] acct:tomb:{proc}         release tombstone
-- KEYS[11] acct:rep:{show}          repair session (field "gen"), if any
-- KEYS[12] acct:repc:{show}         repair session: cores per key
-- KEYS[13] acct:repg:{show}         repair session: GPUs per key
-- KEYS[14] acct:resv:host:{host}     host reservation (optional: without it,
--                                    no reservation check)
--
-- ARGV[1]  mode: "check" (enforce caps) or "force" (apply unconditionally)
-- ARGV[2]  proc id
-- ARGV[3]  show id
-- ARGV[4]  whole cores charged (integer >= 0)
-- ARGV[5]  exact centicores (integer >= 0, recorded only)
-- ARGV[6]  GPUs (integer >= 0)
-- ARGV[7]  job int_max_cores seed   (whole cores, "" = not supplied)
-- ARGV[8]  job int_max_gpus seed    ("" = not supplied)
-- ARGV[9]  folder int_max_cores seed ("" = not supplied)
-- ARGV[10] folder int_max_gpus seed  ("" = not supplied)
-- ARGV[11] host id                   (with KEYS[14])
-- ARGV[12] layer id of the booking   (with KEYS[14]; the owner test)
-- ARGV[13] backfill-until, unix ms   ("" = no backfill claim): when the
--          frame is expected to end at the latest (worst-case runtime)
-- ARGV[14] backend pid (optional, "" = none): the PostgreSQL backend of the
--          one connection the booking's transaction will run on, recorded
--          as field "pid" so a reconcile can prove the record orphaned once
--          that backend is gone (see reconcile.lua)
-- ARGV[15] n: the node-locked (per-host) limits of the layer (optional; "" or
--          0 = none; n > 0 needs the host id ARGV[11]), then n pairs
-- ARGV[16..] limit id, max seats: the host must already hold a seat of the
--          limit (acct:seat:{limit} has a field for it) or fewer than max
--          hosts may hold one. The booking takes (or shares) the seat; the
--          record keeps host and seats so release.lua gives it back when
--          the host's last proc of the limit goes.
--
-- Returns
--   {1, seq}                          booked; seq = acct:seq after the booking
--   {1, seq, "owner"}                 booked by the owner of the host's reservation
--   {1, seq, "backfill"}              booked on a reserved host as an EASY
--                                     backfill (ends before the ready time)
--   {0, "reservation", until, ready_at, why, owner_layer, owner_job}
--                                     the host is reserved for another layer;
--                                     why = "reserved" (no backfill claim) or
--                                     "backfill" (until > ready_at); nothing written
--   {0, "seat", held, max, limit}     no seat of a node-locked limit is free
--                                     and the host holds none; nothing written
--   {0, table, current, limit[, why]} a cap would be exceeded; nothing written
--                                     (why = "missing": no subscription, or a
--                                     folder/job cap field never written)
--   {2, seq}                          duplicate: a record for this proc exists
--   {3}                               show not seeded (check mode only)
--   {4}                               proc already released (tombstone)

local function isint(v)
  local n = tonumber(v)
  return n ~= nil and n == math.floor(n) and n >= 0 and n < 9007199254740992
end

-- Validate everything before the first write: scripts do not roll back.
local mode = ARGV[1]
if mode ~= 'check' and mode ~= 'force' then
  return redis.error_reply('ERR acct book: mode must be "check" or "force", got "' .. tostring(mode) .. '"')
end
local proc, show = ARGV[2], ARGV[3]
if proc == nil or proc == '' then return redis.error_reply('ERR acct book: empty proc id') end
if show == nil or show == '' then return redis.error_reply('ERR acct book: empty show id') end
if not isint(ARGV[4]) or not isint(ARGV[5]) or not isint(ARGV[6]) then
  return redis.error_reply('ERR acct book: cores, centicores and gpus must be non-negative integers, got '
    .. tostring(ARGV[4]) .. ', ' .. tostring(ARGV[5]) .. ', ' .. tostring(ARGV[6]))
end
local resv = KEYS[14]
if resv == '' then resv = nil end
if resv then
  if ARGV[11] == nil or ARGV[11] == '' or ARGV[12] == nil or ARGV[12] == '' then
    return redis.error_reply('ERR acct book: a reservation check needs the host id (ARGV[11]) and the layer id (ARGV[12])')
  end
  local u = ARGV[13]
  if u ~= nil and u ~= '' and not isint(u) then
    return redis.error_reply('ERR acct book: backfill-until ARGV[13] is not a non-negative integer of ms: ' .. u)
  end
end
local pid = ARGV[14]
if pid == '' then pid = nil end
if pid and not isint(pid) then
  return redis.error_reply('ERR acct book: backend pid ARGV[14] is not a non-negative integer: ' .. pid)
end
-- Node-locked limits: {id, max} pairs.
local seatlims = {}
local ns = ARGV[15]
if ns ~= nil and ns ~= '' then
  if not isint(ns) then return redis.error_reply('ERR acct book: seat count ARGV[15] is not a non-negative integer: ' .. ns) end
  ns = tonumber(ns)
  if ns > 0 and (ARGV[11] == nil or ARGV[11] == '') then
    return redis.error_reply('ERR acct book: a node-locked limit needs the host id (ARGV[11])')
  end
  if #ARGV < 15 + 2 * ns then
    return redis.error_reply('ERR acct book: ' .. ns .. ' node-locked limits need ' .. (2 * ns) .. ' arguments after ARGV[15]')
  end
  for i = 1, ns do
    local id, mx = ARGV[14 + 2 * i], ARGV[15 + 2 * i]
    if id == '' or string.find(id, ',', 1, true) then return redis.error_reply('ERR acct book: bad node-locked limit id "' .. id .. '"') end
    if not isint(mx) then return redis.error_reply('ERR acct book: max seats of limit ' .. id .. ' is not a non-negative integer: ' .. mx) end
    seatlims[i] = {id, tonumber(mx)}
  end
end
for i = 7, 10 do
  local v = ARGV[i]
  if v ~= nil and v ~= '' and (tonumber(v) == nil or tonumber(v) ~= math.floor(tonumber(v))) then
    return redis.error_reply('ERR acct book: cap seed ARGV[' .. i .. '] is not an integer: ' .. v)
  end
end
local cores, centi, gpus = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

-- Idempotency: the same proc is charged at most once.
if redis.call('EXISTS', KEYS[7]) == 1 then
  return {2, tonumber(redis.call('HGET', KEYS[7], 'seq')) or 0}
end
if redis.call('EXISTS', KEYS[10]) == 1 then
  return {4}
end
-- Managed-flip gate: an unseeded show is a reason, never a silent zero.
if mode == 'check' and redis.call('HEXISTS', KEYS[8], 'seeded') == 0 then
  return {3}
end

-- Caps the caller read from Postgres fill fields the limit reseed has not
-- written yet (a job created since the last reseed); never overwrite.
local function seed(key, field, v)
  if v ~= nil and v ~= '' then redis.call('HSETNX', key, field, v) end
end
seed(KEYS[3], 'int_max_cores', ARGV[7])
seed(KEYS[3], 'int_max_gpus', ARGV[8])
seed(KEYS[2], 'int_max_cores', ARGV[9])
seed(KEYS[2], 'int_max_gpus', ARGV[10])

-- over checks one folder or job cap: v = {current, max} from HMGET.
-- A missing cap refuses ("missing"): nothing books against a cap nobody
-- wrote (the limit reseed and the caller's seed write every cap, 0
-- included), so a seeding bug shows as work that does not book, never as a
-- job running past its cap. -1 is unlimited only where sentinel is true
-- (folders).
local function over(tbl, v, delta, sentinel)
  local cur = tonumber(v[1]) or 0
  local cap = tonumber(v[2])
  if cap == nil then return {0, tbl, cur, 0, 'missing'} end
  if sentinel and cap == -1 then return nil end
  if cur + delta > cap then return {0, tbl, cur, cap} end
  return nil
end

if mode == 'check' then
  if cores > 0 then
    -- Subscription burst: no "> 0" guard. A burst of 0 is a frozen
    -- subscription (Cuebot requires burst > 0 to book) and a missing
    -- subscription cannot book, as in Cuebot. The seeding gate above makes
    -- "missing because nobody seeded it" unreachable.
    local s = redis.call('HMGET', KEYS[1], 'int_cores', 'burst')
    local cur = tonumber(s[1]) or 0
    if not s[2] then return {0, 'subscription', cur, 0, 'missing'} end
    local burst = tonumber(s[2]) or 0
    if cur + cores > burst then return {0, 'subscription', cur, burst} end
    -- Folder: exactly -1 is unlimited (Cuebot: "int_max_cores = -1 OR
    -- ..."); any other value is a cap, so 0 books nothing. Job: no
    -- unlimited value (Cuebot books while int_cores + need <= max).
    local f = redis.call('HMGET', KEYS[2], 'int_cores', 'int_max_cores')
    local r = over('folder', f, cores, true)
    if r then return r end
    local j = redis.call('HMGET', KEYS[3], 'int_cores', 'int_max_cores')
    r = over('job', j, cores, false)
    if r then return r end
  end
  if gpus > 0 then
    -- The same for GPUs; a proc without GPUs is never checked against them.
    local f = redis.call('HMGET', KEYS[2], 'int_gpus', 'int_max_gpus')
    local r = over('folder_gpus', f, gpus, true)
    if r then return r end
    local j = redis.call('HMGET', KEYS[3], 'int_gpus', 'int_max_gpus')
    r = over('job_gpus', j, gpus, false)
    if r then return r end
  end
end

-- Firm host reservation: a live reservation (expires_at after now) lets
-- only its owner layer book the host, or a backfill that ends (by its
-- worst-case runtime) no later than the host's projected ready time.
local tag = nil
if mode == 'check' and resv then
  local r = redis.call('HMGET', resv, 'layer', 'ready_at', 'expires_at', 'job')
  if r[1] then
    local t0 = redis.call('TIME')
    local now = tonumber(t0[1]) * 1000 + math.floor(tonumber(t0[2]) / 1000)
    if (tonumber(r[3]) or 0) > now then
      if r[1] == ARGV[12] then
        tag = 'owner'
      else
        local ready = tonumber(r[2]) or 0
        local u = tonumber(ARGV[13])
        if u == nil then
          return {0, 'reservation', 0, ready, 'reserved', r[1], r[4] or ''}
        end
        if u > ready then
          return {0, 'reservation', u, ready, 'backfill', r[1], r[4] or ''}
        end
        tag = 'backfill'
      end
    end
  end
end

-- Node-locked limits: a host that holds a seat shares it; otherwise a seat
-- must be free (fewer than max hosts hold one).
if mode == 'check' then
  for _, sl in ipairs(seatlims) do
    local sk = 'acct:seat:' .. sl[1]
    if redis.call('HEXISTS', sk, ARGV[11]) == 0 then
      local held = redis.call('HLEN', sk)
      if held >= sl[2] then return {0, 'seat', held, sl[2], sl[1]} end
    end
  end
end

for i = 1, 5 do
  redis.call('HINCRBY', KEYS[i], 'int_cores', string.format('%d', cores))
  redis.call('HINCRBY', KEYS[i], 'int_gpus', string.format('%d', gpus))
end
local seq = redis.call('INCR', KEYS[6])
local t = redis.call('TIME')
local ms = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[7],
  'show', show, 'sub', KEYS[1], 'folder', KEYS[2], 'job', KEYS[3], 'layer', KEYS[4], 'point', KEYS[5],
  'cores', string.format('%d', cores), 'centi', string.format('%d', centi), 'gpus', string.format('%d', gpus),
  'seq', string.format('%d', seq), 'ts', ms, 'origin', mode)
if pid then redis.call('HSET', KEYS[7], 'pid', pid) end
redis.call('SADD', KEYS[9], proc)
if #seatlims > 0 then
  local ids = {}
  for i, sl in ipairs(seatlims) do
    redis.call('HINCRBY', 'acct:seat:' .. sl[1], ARGV[11], 1)
    ids[i] = sl[1]
  end
  redis.call('HSET', KEYS[7], 'host', ARGV[11], 'seats', table.concat(ids, ','))
end
-- A repair of this show is summing its records: count this one in.
local gen = redis.call('HGET', KEYS[11], 'gen')
if gen then
  for i = 1, 5 do
    redis.call('HINCRBY', KEYS[12], KEYS[i], string.format('%d', cores))
    redis.call('HINCRBY', KEYS[13], KEYS[i], string.format('%d', gpus))
  end
  redis.call('HSET', KEYS[7], 'rg', gen)
end
if tag then
  if tag == 'backfill' then redis.call('HINCRBY', resv, 'backfills', 1) end
  redis.call('HSET', KEYS[7], 'resv', tag)
  return {1, seq, tag}
end
return {1, seq}
