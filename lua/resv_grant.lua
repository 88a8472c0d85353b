-- resv_grant.lua: grant one firm host reservation, atomically, if the host
-- is free of reservations, the layer holds none, and the caps on grants
-- hold. See package lua and scheduler/reservations for the contract.
--
-- KEYS[1]  acct:resv:host:{host}   the reservation hash
-- KEYS[2]  acct:resv:index         SET of host ids holding a reservation
--
-- ARGV[1]  host id
-- ARGV[2]  host name (display)
-- ARGV[3]  owner layer id
-- ARGV[4]  owner job id
-- ARGV[5]  show id
-- ARGV[6]  allocation id of the host
-- ARGV[7]  cores one frame of the owner needs (centicores, integer >= 0)
-- ARGV[8]  memory one frame needs (KB, integer >= 0)
-- ARGV[9]  projected ready time, unix ms (integer >= 0)
-- ARGV[10] timeout, ms (integer > 0): the reservation expires this long
--          after the grant, by Redis time
-- ARGV[11] granted by (instance name)
-- ARGV[12] max reservations held at once (integer >= 0)
-- ARGV[13] max reservations held among ARGV[16..] (integer >= 0)
-- ARGV[14] owner layer name (display)
-- ARGV[15] owner job name (display)
-- ARGV[16..] the hosts of the host's allocation that would fit a frame of
--          the layer when idle (the host itself included): at most
--          ARGV[13] of them may be reserved, by anyone
--
-- Index members whose hash is gone or expired are dropped first (their
-- hashes deleted), so the counts are of live reservations only. Index
-- member hash keys are built here from the ids: single node / Sentinel only.
--
-- Returns
--   {1, now_ms, expires_at_ms}       granted (Redis time)
--   {0, "host_reserved", layer}      the host already holds a live reservation
--   {0, "layer_holds", host}         the layer already holds one (on host)
--   {0, "max_grants", held}          ARGV[12] reservations are held
--   {0, "max_fraction", held}        ARGV[13] of the fitting hosts are reserved

local function isint(v)
  local n = tonumber(v)
  return n ~= nil and n == math.floor(n) and n >= 0 and n < 9007199254740992
end

for i = 1, 6 do
  if ARGV[i] == nil or ARGV[i] == '' then
    return redis.error_reply('ERR acct resv grant: ARGV[' .. i .. '] is empty')
  end
end
for _, i in ipairs({7, 8, 9, 10, 12, 13}) do
  if not isint(ARGV[i]) then
    return redis.error_reply('ERR acct resv grant: ARGV[' .. i .. '] is not a non-negative integer: ' .. tostring(ARGV[i]))
  end
end
local host, layer, alloc = ARGV[1], ARGV[3], ARGV[6]
if tonumber(ARGV[10]) <= 0 then
  return redis.error_reply('ERR acct resv grant: timeout ARGV[10] must be > 0 ms')
end
local t0 = redis.call('TIME')
local now = tonumber(t0[1]) * 1000 + math.floor(tonumber(t0[2]) / 1000)
local expires = now + tonumber(ARGV[10])

local function live(f)
  return f[1] and (tonumber(f[3]) or 0) > now
end

local fitting = {}
for i = 16, #ARGV do fitting[ARGV[i]] = true end
local held, inAlloc, holds = 0, 0, nil
for _, m in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local hk = 'acct:resv:host:' .. m
  local f = redis.call('HMGET', hk, 'layer', 'alloc', 'expires_at')
  if not live(f) then
    redis.call('SREM', KEYS[2], m)
    if f[1] then redis.call('DEL', hk) end
  else
    held = held + 1
    if fitting[m] then inAlloc = inAlloc + 1 end
    if f[1] == layer then holds = m end
  end
end

local cur = redis.call('HMGET', KEYS[1], 'layer', 'alloc', 'expires_at')
if live(cur) then return {0, 'host_reserved', cur[1]} end
if holds then return {0, 'layer_holds', holds} end
if held >= tonumber(ARGV[12]) then return {0, 'max_grants', held} end
if inAlloc >= tonumber(ARGV[13]) then return {0, 'max_fraction', inAlloc} end

redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1],
  'host', host, 'host_name', ARGV[2], 'layer', layer, 'job', ARGV[4], 'show', ARGV[5], 'alloc', alloc,
  'cores', ARGV[7], 'mem', ARGV[8], 'ready_at', ARGV[9], 'expires_at', string.format('%d', expires),
  'granted_at', string.format('%d', now), 'granted_by', ARGV[11] or '', 'backfills', 0,
  'layer_name', ARGV[14] or '', 'job_name', ARGV[15] or '')
-- Safety net: a reservation nobody ends (every scheduler gone) leaves
-- Redis an hour after its expiry.
redis.call('PEXPIREAT', KEYS[1], expires + 3600000)
redis.call('SADD', KEYS[2], host)
return {1, now, expires}
