-- notify_done: finish a claimed job.
-- KEYS[1]  the shard's due set
-- KEYS[2]  the shard's job hash
-- KEYS[3]  outcome "sent" of a message job: its (device, conversation)'s
--          last notification, set to "seq|now" (otherwise any key of the
--          shard, unused)
-- ARGV[1]  job id
-- ARGV[2]  the seq the claim saw
-- ARGV[3]  the count the claim saw
-- ARGV[4]  outcome: "sent", "drop" or "retry"
-- ARGV[5]  now (Unix ms); for "retry", when to try again
-- ARGV[6]  the least gap between two notifications (ms)
-- ARGV[7]  how long to keep the last notification (ms)
-- ARGV[8]  "1" for a message job (KEYS[3] is its last notification)
-- Messages merged into the job after the claim stay queued as the next
-- notification, due ARGV[6] later. Returns 1 if the job is gone, 2 if it
-- stays queued.
local id = ARGV[1]
local cur = redis.call('HGET', KEYS[2], id)
if not cur then
  redis.call('ZREM', KEYS[1], id)
  return 1
end
local s, c, t, f, lo, a, body = string.match(cur, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
s, c = tonumber(s), tonumber(c)
local now, claimed = tonumber(ARGV[5]), tonumber(ARGV[2])
local function enc(s2, c2, t2, f2, lo2, a2)
  return string.format('%.0f|%.0f|%s|%.0f|%.0f|%.0f|', s2, c2, t2, f2, lo2, a2) .. body
end
if ARGV[4] == 'retry' then
  redis.call('HSET', KEYS[2], id, enc(s, c, t, 0, tonumber(lo), tonumber(a) + 1))
  redis.call('ZADD', KEYS[1], now, id)
  return 2
end
if ARGV[4] == 'sent' and ARGV[8] == '1' then
  redis.call('SET', KEYS[3], string.format('%.0f|%.0f', claimed, now), 'PX', tonumber(ARGV[7]))
end
if s > claimed then
  redis.call('HSET', KEYS[2], id, enc(s, math.max(c - tonumber(ARGV[3]), 1), t, 0, claimed + 1, 0))
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[6]), id)
  return 2
end
redis.call('HDEL', KEYS[2], id)
redis.call('ZREM', KEYS[1], id)
return 1
