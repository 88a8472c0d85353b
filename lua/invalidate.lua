-- invalidate.lua: close every show for booking because the accounting state
-- cannot be trusted (a scheduler saw it roll back: Redis restarted from an
-- older snapshot, or a failover to a replica that missed writes). Removes
-- acct:epoch (the loop leader re-bootstraps from Postgres, every instance's
-- gate closes) and every seeding marker, so the booking script answers "not
-- seeded" at once, on every instance, until the re-bootstrap re-seeds them.
--
-- KEYS[1] acct:epoch
-- KEYS[2] acct:shows
-- ARGV[1] the epoch the caller found rolled back ("" = whatever is current)
--
-- Returns {1, shows closed} or {0, current epoch} when acct:epoch is no
-- longer ARGV[1] (someone re-bootstrapped meanwhile: nothing done).
local cur = redis.call('GET', KEYS[1])
if ARGV[1] ~= '' and cur ~= ARGV[1] then
  return {0, cur or ''}
end
local shows = redis.call('SMEMBERS', KEYS[2])
for _, sh in ipairs(shows) do
  redis.call('DEL', 'acct:show:' .. sh)
end
redis.call('DEL', KEYS[2])
redis.call('DEL', KEYS[1])
return {1, #shows}
