-- route_set: register a device connection in its user's routing hash.
-- KEYS[1]  the user's routing hash ({user}-tagged); field <device> holds
--          "<token>|<gateway>|<boot>", field "#<device>" the last token issued
-- ARGV[1]  device
-- ARGV[2]  fencing token of this connection, or 0 to issue a new one
-- ARGV[3]  "<gateway>|<boot>" of the gateway holding the connection
-- ARGV[4]  now in microseconds (floor for new tokens, so tokens keep
--          growing even if Redis lost the counter)
-- Returns {token, previous entry or ""} on success, or {0, current entry}
-- when a newer connection of the device is registered already: a late
-- write from an old connection or gateway never overwrites a newer one.
local dev = ARGV[1]
local token = tonumber(ARGV[2])
if token == 0 then
  token = redis.call('HINCRBY', KEYS[1], '#' .. dev, 1)
  local now = tonumber(ARGV[4])
  if token < now then
    token = now
    redis.call('HSET', KEYS[1], '#' .. dev, string.format('%.0f', now))
  end
end
local prev = redis.call('HGET', KEYS[1], dev) or ''
if prev ~= '' then
  local cur = tonumber(string.match(prev, '^(%d+)|'))
  if cur and cur >= token then
    if cur == token then
      redis.call('HSET', KEYS[1], dev, string.format('%.0f', token) .. '|' .. ARGV[3])
      return {string.format('%.0f', token), prev}
    end
    return {0, prev}
  end
end
redis.call('HSET', KEYS[1], dev, string.format('%.0f', token) .. '|' .. ARGV[3])
return {string.format('%.0f', token), prev}
