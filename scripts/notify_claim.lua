-- notify_claim: take up to ARGV[3] due jobs of a shard for ARGV[2] - now
-- (a lease): each taken job is due again at ARGV[2], so if its worker dies
-- another takes it then. Each job's tries field counts claims not
-- finished yet: a job claimed with tries > 0 was abandoned mid-send.
-- KEYS[1]  the shard's due set
-- KEYS[2]  the shard's job hash
-- ARGV[1]  now (Unix ms)
-- ARGV[2]  lease end (Unix ms)
-- ARGV[3]  most jobs to take
-- Returns id1, value1, id2, value2, … (values as before the claim), and
-- last when the shard's next job is due (Unix ms; "" if it has none).
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  local v = redis.call('HGET', KEYS[2], id)
  if v then
    local s, c, t, f, rest = string.match(v, '^(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
    redis.call('HSET', KEYS[2], id, s .. '|' .. c .. '|' .. t .. '|' .. string.format('%.0f', tonumber(f) + 1) .. '|' .. rest)
    redis.call('ZADD', KEYS[1], tonumber(ARGV[2]), id)
    out[#out + 1] = id
    out[#out + 1] = v
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
out[#out + 1] = nxt[2] or ''
return out
