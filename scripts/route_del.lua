-- route_del: remove a device's routing entry if it is still this connection's.
-- Also removes a device's entry from a conversation's online index (same
-- layout: field device, value "token|…").
-- KEYS[1]  the user's routing hash ({user}-tagged), or a conversation's
--          online index ({conv}-tagged)
-- ARGV[1]  device
-- ARGV[2]  fencing token of the connection that closed
-- Returns 1 if removed, 0 if a newer connection owns the entry (or none).
local prev = redis.call('HGET', KEYS[1], ARGV[1])
if not prev then
  return 0
end
local cur = string.match(prev, '^(%d+)|')
if cur == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
return 0
