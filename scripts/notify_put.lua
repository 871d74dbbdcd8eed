-- notify_put: add notification jobs to a shard's queue, or merge messages
-- into the pending notifications of their (device, conversation)s: any
-- number of jobs of one shard per call (one script invocation instead of
-- one per job).
-- KEYS[1]    the shard's due set (job id -> when it is due, Unix ms)
-- KEYS[2]    the shard's job hash (job id -> "seq|count|ts|tries|lo|attempts|body")
-- KEYS[2+i]  job i in mode "merge": its (device, conversation)'s last
--            notification ("seq|sent_ms"); otherwise any key of the shard
--            (unused)
-- ARGV[1]    the least gap between two notifications of one (device,
--            conversation) (ms)
-- then 7 arguments per job i (ARGV[2+7(i-1)] …):
--   id, due (Unix ms), seq, ts (Unix ms), body (opaque),
--   mode: "new" (add unless present) or "merge",
--   merge: the seqs of every message merged at once, ascending,
--   space-separated, seq the last of them ("": seq alone)
-- Returns how many jobs were added or changed (a job that exists, or a
-- message a notification already covered, changes nothing).
local gap = tonumber(ARGV[1])
local function enc(s, c, t, f, lo, a, body)
  return string.format('%.0f|%.0f|%.0f|%.0f|%.0f|%.0f|', s, c, t, f, lo, a) .. body
end
local function merge(sentKey, id, due, seq, ts, body, seqs)
  local cur = redis.call('HGET', KEYS[2], id)
  -- only messages above both the last notification and the pending one
  -- are merged (and counted)
  local floor, sent = 0, 0
  local st = redis.call('GET', sentKey)
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
  if seqs ~= '' then
    for v in string.gmatch(seqs, '%d+') do
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
    redis.call('HSET', KEYS[2], id, enc(seq, c + n, ts, tonumber(f), tonumber(lo), tonumber(a), body))
    return 1
  end
  redis.call('HSET', KEYS[2], id, enc(seq, n, ts, 0, low, 0, body))
  redis.call('ZADD', KEYS[1], math.max(due, sent + gap), id)
  return 1
end
local changed = 0
for i = 1, #KEYS - 2 do
  local b = 2 + 7 * (i - 1)
  local id, due, seq, ts, body, mode = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), ARGV[b + 4], ARGV[b + 5]
  if mode == 'merge' then
    changed = changed + merge(KEYS[2 + i], id, due, seq, ts, body, ARGV[b + 6])
  elseif redis.call('HSETNX', KEYS[2], id, enc(seq, 1, ts, 0, seq, 0, body)) == 1 then
    redis.call('ZADD', KEYS[1], 'NX', due, id)
    changed = changed + 1
  end
end
return changed
