-- notify_gate: a provider worker about to send a notification to a device
-- enters the device's gate. The send may go only if the device's fence is
-- still the value it had before the notification's registration was read
-- from PostgreSQL; it is then marked in flight until its worker's answer
-- is recorded (or until it expires, if the worker dies), so that a
-- withdrawal (notify_fence) waits for it.
-- KEYS[1]  the device's fence (a counter; missing reads as 0)
-- KEYS[2]  the device's sends in flight (sorted set: send id -> expiry, Unix ms)
-- ARGV[1]  the fence read before the registration
-- ARGV[2]  this send's id
-- ARGV[3]  how long the mark lasts (ms): longer than one provider request
-- Returns 1 if the send may go, 0 if the fence moved (the registration
-- was withdrawn or replaced meanwhile).
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[3]))
return 1
