-- repair.lua: rewrite the booked counters of one show to the sum of the
-- per-proc records charging them, over a zero baseline of the show's keys,
-- in bounded steps. Bookings and releases keep "counter = sum of records"
-- incrementally; this is the safety net for anything that changed a counter
-- outside the scripts (a hand edit, a legacy publisher decrementing without
-- records, a key deleted), and it resets counters whose procs all drained.
--
-- A repair is a session (gen) on the show. While it is open, every script
-- that adds, moves or removes a record the session has counted (record field
-- rg = gen) mirrors that change into the session's sums, so after the scan
-- the sums equal the sum of the records at every instant, and the fix step
-- can compare and rewrite any subset of keys at any time. No step is longer
-- than its batch.
--
-- KEYS[1]  acct:procs:{show}
-- KEYS[2]  acct:rep:{show}     session: field gen
-- KEYS[3]  acct:repc:{show}    session sums: cores per key
-- KEYS[4]  acct:repg:{show}    session sums: GPUs per key
--
-- ARGV[1]  mode: start | scan | fix | finish
-- ARGV[2]  gen (session id, chosen by the caller)
-- ARGV[3]  session TTL in ms (refreshed by every step; a session whose
--          driver died expires)
-- start:   opens the session (replacing any other); returns {1}
-- scan:    ARGV[4] SSCAN cursor, ARGV[5] COUNT; counts the records the scan
--          returns that the session has not counted yet; returns
--          {1, next_cursor, counted} (cursor "0" = scan complete)
-- fix:     ARGV[4..] keys to check (the zero baseline plus every key the sums
--          name); rewrites a counter that differs from the sums; returns
--          {1, keys_fixed, drift_sub, drift_folder, drift_job, drift_layer, drift_point}
-- finish:  closes the session; returns {1}
-- Any step of a session that is no longer current returns {0}.

local mode, gen, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
if mode ~= 'start' and mode ~= 'scan' and mode ~= 'fix' and mode ~= 'finish' then
  return redis.error_reply('ERR acct repair: mode must be start, scan, fix or finish, got "' .. tostring(mode) .. '"')
end
if gen == nil or gen == '' then return redis.error_reply('ERR acct repair: empty session id') end
if ttl == nil or ttl <= 0 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR acct repair: TTL must be a positive integer of milliseconds, got ' .. tostring(ARGV[3]))
end

local function touch()
  for i = 2, 4 do redis.call('PEXPIRE', KEYS[i], string.format('%d', ttl)) end
end

if mode == 'start' then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  redis.call('HSET', KEYS[2], 'gen', gen)
  touch()
  return {1}
end

if redis.call('HGET', KEYS[2], 'gen') ~= gen then return {0} end

if mode == 'finish' then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  return {1}
end

if mode == 'scan' then
  local count = tonumber(ARGV[5])
  if ARGV[4] == nil or count == nil or count <= 0 then
    return redis.error_reply('ERR acct repair: scan needs a cursor and a positive count')
  end
  local res = redis.call('SSCAN', KEYS[1], ARGV[4], 'COUNT', string.format('%d', count))
  local counted = 0
  for _, id in ipairs(res[2]) do
    local rk = 'acct:proc:' .. id
    local r = redis.call('HMGET', rk, 'sub', 'folder', 'job', 'layer', 'point', 'cores', 'gpus', 'rg')
    if not r[1] then
      redis.call('SREM', KEYS[1], id) -- dangling member
    elseif r[8] ~= gen then -- SSCAN may return a member twice
      local c, g = tonumber(r[6]) or 0, tonumber(r[7]) or 0
      for j = 1, 5 do
        if r[j] then
          redis.call('HINCRBY', KEYS[3], r[j], string.format('%d', c))
          redis.call('HINCRBY', KEYS[4], r[j], string.format('%d', g))
        end
      end
      redis.call('HSET', rk, 'rg', gen)
      counted = counted + 1
    end
  end
  touch()
  return {1, res[1], counted}
end

-- fix
local PREFIX = {['acct:sub:'] = 3, ['acct:folder:'] = 4, ['acct:job:'] = 5, ['acct:layer:'] = 6, ['acct:point:'] = 7}
local out = {1, 0, 0, 0, 0, 0, 0}
for i = 4, #ARGV do
  local key = ARGV[i]
  if key == '' then return redis.error_reply('ERR acct repair: empty key at position ' .. (i - 3)) end
end
for i = 4, #ARGV do
  local key = ARGV[i]
  local wc = tonumber(redis.call('HGET', KEYS[3], key)) or 0
  local wg = tonumber(redis.call('HGET', KEYS[4], key)) or 0
  local cur = redis.call('HMGET', key, 'int_cores', 'int_gpus')
  local cc, cg = tonumber(cur[1]), tonumber(cur[2])
  if cc ~= wc or cg ~= wg then
    redis.call('HSET', key, 'int_cores', string.format('%d', wc), 'int_gpus', string.format('%d', wg))
    out[2] = out[2] + 1
    local idx = PREFIX[string.match(key, '^acct:%a+:')]
    if idx then out[idx] = out[idx] + math.abs((cc or 0) - wc) end
  end
end
touch()
return out
