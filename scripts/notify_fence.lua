-- notify_fence: withdraw a device's notification address (revoked,
-- unregistered, reinstalled, its token replaced, its user suspended):
-- move the device's fence, so that no send that read the old
-- registration passes notify_gate any more, and count the sends that
-- passed it before and are still in flight. The caller repeats the count
-- (ARGV[1] = 0) until it is 0.
-- KEYS[1]  the device's fence
-- KEYS[2]  the device's sends in flight (see notify_gate)
-- ARGV[1]  1: move the fence; 0: only count
-- ARGV[2]  how long the fence is kept (ms): longer than any send that
--          read a registration before it moved can wait for its gate
-- Returns the sends in flight that have not expired.
if ARGV[1] == '1' then
  redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return redis.call('ZCARD', KEYS[2])
