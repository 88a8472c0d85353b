-- seed.lua: the bootstrap's term fence. Only the loop leader writes the
-- seeding state, but a leader that stalled past its lock (and lost it) may
-- still have one write in flight when it resumes. Every write of the
-- seeding state names the bootstrap epoch it belongs to, and is refused
-- unless that epoch is the current one, so a stalled leader's marker or
-- epoch never lands in a Redis that another leader has re-bootstrapped
-- (after a restart or FLUSHALL every old epoch is unknown).
--
-- KEYS[1] acct:epoch      the finished bootstrap's epoch (absent = not bootstrapped)
-- KEYS[2] acct:bootstrap  the epoch of the bootstrap under way or last begun
-- KEYS[3] acct:show:{show} (mode mark only)
-- KEYS[4] acct:shows       (mode mark only)
-- ARGV[1] mode: begin | mark | finish
-- ARGV[2] epoch (non-empty)
-- ARGV[3] timestamp text (mode mark only)
-- ARGV[4] show id, the member of acct:shows (mode mark only)
--
-- begin:  SET acct:bootstrap epoch (a new leader's bootstrap supersedes
--         any other under way); always {1}.
-- mark:   the show's marker (seeded = epoch, ts) and acct:shows, only if
--         acct:epoch = epoch, or acct:epoch is absent and acct:bootstrap =
--         epoch; {1} written, {0, current epoch, current bootstrap} refused.
-- finish: SET acct:epoch epoch, only if acct:bootstrap = epoch; {1} or
--         {0, current epoch, current bootstrap}.
local mode, epoch = ARGV[1], ARGV[2]
if type(epoch) ~= 'string' or epoch == '' then
  return redis.error_reply('seed: empty epoch')
end
if mode == 'begin' then
  redis.call('SET', KEYS[2], epoch)
  return {1}
end
local cur = redis.call('GET', KEYS[1])
local boot = redis.call('GET', KEYS[2])
if mode == 'mark' then
  if #KEYS < 4 or type(ARGV[3]) ~= 'string' or type(ARGV[4]) ~= 'string' or ARGV[4] == '' then
    return redis.error_reply('seed: mark needs the show keys, a timestamp and the show id')
  end
  local ok
  if cur then ok = (cur == epoch) else ok = (boot == epoch) end
  if not ok then return {0, cur or '', boot or ''} end
  redis.call('HSET', KEYS[3], 'seeded', epoch, 'ts', ARGV[3])
  redis.call('SADD', KEYS[4], ARGV[4])
  return {1}
elseif mode == 'finish' then
  if boot ~= epoch then return {0, cur or '', boot or ''} end
  redis.call('SET', KEYS[1], epoch)
  return {1}
end
return redis.error_reply('seed: unknown mode ' .. tostring(mode))
