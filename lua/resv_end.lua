-- resv_end.lua: end one host reservation, optionally only if a given layer
-- owns it. See package lua and scheduler/reservations.
--
-- KEYS[1]  acct:resv:host:{host}
-- KEYS[2]  acct:resv:index
--
-- ARGV[1]  host id
-- ARGV[2]  expected owner layer id ("" = whoever owns it)
--
-- Returns
--   {1, layer, job}   ended (the hash is deleted, the host leaves the index)
--   {0}               no reservation on the host (a stale index member is dropped)
--   {2, layer}        the reservation belongs to another layer: unchanged

if ARGV[1] == nil or ARGV[1] == '' then
  return redis.error_reply('ERR acct resv end: empty host id')
end
local f = redis.call('HMGET', KEYS[1], 'layer', 'job')
if not f[1] then
  redis.call('SREM', KEYS[2], ARGV[1])
  return {0}
end
if ARGV[2] ~= nil and ARGV[2] ~= '' and f[1] ~= ARGV[2] then
  return {2, f[1]}
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return {1, f[1], f[2] or ''}
