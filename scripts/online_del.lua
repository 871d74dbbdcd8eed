-- online_del: remove a device's entry from a conversation's online index
-- if it still belongs to this connection.
-- KEYS[1]  the conversation's online hash ({conv}-tagged)
-- ARGV[1]  device
-- ARGV[2]  fencing token of the connection (as in the routing table)
-- Returns 1 if removed, 0 if another connection owns the entry (or none).
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
