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
-- Returns 1 if a job was added or changed, 0 if nothing changed (the job
-- exists, or a notification already covered the seq).
local id, seq, ts = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = redis.call('HGET', KEYS[2], id)
local function enc(s, c, t, f, lo, a, body)
  return string.format('%.0f|%.0f|%.0f|%.0f|%.0f|%.0f|', s, c, t, f, lo, a) .. body
end
if ARGV[6] == 'merge' then
  local st = redis.call('GET', KEYS[3])
  local sent = 0
  if st then
    local last, at = string.match(st, '^(%d+)|(%d+)')
    if seq <= tonumber(last) then
      return 0
    end
    sent = tonumber(at)
  end
  if cur then
    local s, c, t, f, lo, a = string.match(cur, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|')
    if seq <= tonumber(s) then
      return 0
    end
    -- the newest message replaces the older one; count grows
    redis.call('HSET', KEYS[2], id, enc(seq, tonumber(c) + 1, ts, tonumber(f), tonumber(lo), tonumber(a), ARGV[5]))
    return 1
  end
  local due = math.max(tonumber(ARGV[2]), sent + tonumber(ARGV[7]))
  redis.call('HSET', KEYS[2], id, enc(seq, 1, ts, 0, seq, 0, ARGV[5]))
  redis.call('ZADD', KEYS[1], due, id)
  return 1
end
if cur then
  return 0
end
redis.call('HSET', KEYS[2], id, enc(seq, 1, ts, 0, seq, 0, ARGV[5]))
redis.call('ZADD', KEYS[1], 'NX', tonumber(ARGV[2]), id)
return 1
