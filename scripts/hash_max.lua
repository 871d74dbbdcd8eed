-- hash_max: max-merge one field of each of one or more hashes (delivery
-- cursors, read positions).
-- KEYS[i]       hash i (a hash may appear more than once); on Redis
--               Cluster one call's keys must share a hash slot (RunMany
--               sees to it)
-- ARGV[1]       ttl in seconds to (re)set on each hash, 0 for none
-- ARGV[2i]      the field of KEYS[i]
-- ARGV[2i+1]    its value (integer >= 0)
-- Returns an array with, for each key, the merged value: max(stored,
-- value). Values stay below 2^53, where Lua numbers are exact.
-- A key that fails (wrong type) gets its error in its place; the others
-- are still merged.
local ttl = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local field, v = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  local prev = redis.pcall('HGET', key, field)
  if type(prev) == 'table' and prev.err then
    out[i] = prev
  else
    local cur = tonumber(prev or '0')
    if v > cur then
      redis.call('HSET', key, field, ARGV[2 * i + 1])
      cur = v
    end
    if ttl > 0 then
      redis.call('EXPIRE', key, ttl)
    end
    out[i] = cur
  end
end
return out
