-- seq_floor: raise a conversation's seq counter to at least a floor.
-- KEYS[1]  the conversation's seq counter ({conv}-tagged)
-- ARGV[1]  floor: the highest seq committed in PostgreSQL
-- Returns the counter after the merge. Never lowers the counter, so
-- concurrent re-seeds from several gateways are harmless.
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
local floor = tonumber(ARGV[1])
if cur < floor then
  redis.call('SET', KEYS[1], ARGV[1])
  return floor
end
return cur
