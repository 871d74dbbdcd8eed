-- notify_put: add a notification job to a shard's queue, or merge a
-- message into the pending notification of its (device, conversation).
-- KEYS[1]  the shard's due set (job id -> when it is due, Unix ms)
-- KEYS[2]  the shard's job hash (job id -> "seq|count|ts|tries|lo|attempts|body")
-- KEYS[3]  mode "merge": the (device, conversation)'s last notification
--          ("seq|sent_ms"); otherwise any key of the shard (unused)
-- ARGV[1]  job id
-- ARGV[2]  due (Unix ms)
-- ARGV[3]  seq
-- ARGV[4]  ts (Unix ms)
-- ARGV[5]  body (opaque)
-- ARGV[6]  mode: "new" (add unless present) or "merge"
-- ARGV[7]  merge: the least gap between two notifications (ms)
-- ARGV[8]  merge, optional: the seqs of every message merged at once,
--          ascending, space-separated (ARGV[3] is the last of them);
--          absent: ARGV[3] alone
-- Returns 1 if a job was added or changed, 0 if nothing changed (the job
-- exists, or a notification already covered the seq).
local id, seq, ts = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = redis.call('HGET', KEYS[2], id)
local function enc(s, c, t, f, lo, a, body)
  return string.format('%.0f|%.0f|%.0f|%.0f|%.0f|%.0f|', s, c, t, f, lo, a) .. body
end
if ARGV[6] == 'merge' then
  -- only messages above both the last notification and the pending one
  -- are merged (and counted)
  local floor, sent = 0, 0
  local st = redis.call('GET', KEYS[3])
  if st then
    local last, at = string.match(st, '^(%d+)|(%d+)')
    floor, sent = tonumber(last), tonumber(at)
  end
  local s, c, f, lo, a
  if cur then
    s, c, f, lo, a = string.match(cur, '^(%d+)|(%d+)|%d+|(%d+)|(%d+)|(%d+)|')
    s, c = tonumber(s), tonumber(c)
    floor = math.max(floor, s)
  end
  local n, low = 0, nil
  if ARGV[8] then
    for v in string.gmatch(ARGV[8], '%d+') do
      local q = tonumber(v)
      if q > floor then
        n = n + 1
        low = low or q
      end
    end
  elseif seq > floor then
    n, low = 1, seq
  end
  if n == 0 or seq <= floor then
    return 0
  end
  if cur then
    -- the newest message replaces the older one; count grows
    redis.call('HSET', KEYS[2], id, enc(seq, c + n, ts, tonumber(f), tonumber(lo), tonumber(a), ARGV[5]))
    return 1
  end
  local due = math.max(tonumber(ARGV[2]), sent + tonumber(ARGV[7]))
  redis.call('HSET', KEYS[2], id, enc(seq, n, ts, 0, low, 0, ARGV[5]))
  redis.call('ZADD', KEYS[1], due, id)
  return 1
end
if cur then
  return 0
end
redis.call('HSET', KEYS[2], id, enc(seq, 1, ts, 0, seq, 0, ARGV[5]))
redis.call('ZADD', KEYS[1], 'NX', tonumber(ARGV[2]), id)
return 1
