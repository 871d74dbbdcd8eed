-- hash_max: max-merge one field of a hash (delivery cursors, read positions).
-- KEYS[1]  the hash
-- ARGV[1]  field
-- ARGV[2]  value (integer >= 0)
-- ARGV[3]  ttl in seconds to (re)set on the hash, 0 for none
-- Returns the merged value: max(stored, value). Values stay below 2^53,
-- where Lua numbers are exact.
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local v = tonumber(ARGV[2])
if v > cur then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  cur = v
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
end
return cur
