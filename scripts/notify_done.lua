-- notify_done: finish claimed jobs of one shard, any number per call.
-- KEYS[1]    the shard's due set
-- KEYS[2]    the shard's job hash
-- KEYS[2+i]  job i, a message job: its (device, conversation)'s last
--            notification, set to "seq|now" when the outcome is "sent"
--            (otherwise any key of the shard, unused)
-- ARGV[1]    the least gap between two notifications (ms)
-- ARGV[2]    how long to keep the last notification (ms)
-- then 5 arguments per job i (ARGV[3+5(i-1)] …):
--   id, the seq the claim saw, the count the claim saw,
--   outcome: "sent", "drop" or "retry",
--   now (Unix ms); for "retry", when to try again
-- A message job is one whose id starts with "m". Messages merged into a
-- job after its claim stay queued as the next notification, due ARGV[1]
-- later. Returns how many of the jobs stay queued.
local gap, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
local function finish(sentKey, id, claimed, claimedCount, outcome, now)
  local cur = redis.call('HGET', KEYS[2], id)
  if not cur then
    redis.call('ZREM', KEYS[1], id)
    return 0
  end
  local s, c, t, f, lo, a, body = string.match(cur, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
  s, c = tonumber(s), tonumber(c)
  local function enc(s2, c2, t2, f2, lo2, a2)
    return string.format('%.0f|%.0f|%s|%.0f|%.0f|%.0f|', s2, c2, t2, f2, lo2, a2) .. body
  end
  if outcome == 'retry' then
    redis.call('HSET', KEYS[2], id, enc(s, c, t, 0, tonumber(lo), tonumber(a) + 1))
    redis.call('ZADD', KEYS[1], now, id)
    return 1
  end
  if outcome == 'sent' and string.sub(id, 1, 1) == 'm' then
    redis.call('SET', sentKey, string.format('%.0f|%.0f', claimed, now), 'PX', keep)
  end
  if s > claimed then
    redis.call('HSET', KEYS[2], id, enc(s, math.max(c - claimedCount, 1), t, 0, claimed + 1, 0))
    redis.call('ZADD', KEYS[1], now + gap, id)
    return 1
  end
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
  return 0
end
local kept = 0
for i = 1, #KEYS - 2 do
  local b = 3 + 5 * (i - 1)
  kept = kept + finish(KEYS[2 + i], ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), ARGV[b + 3], tonumber(ARGV[b + 4]))
end
return kept
