-- receipt_gate: coalesces read receipts of one (conversation, user) over
-- every gateway: at most one is sent per window, and never one that does
-- not advance past the last one sent.
-- KEYS[1]   the window key of (conv, user) (exists while a receipt was sent
--           less than a window ago)
-- KEYS[2]   the last read position sent for (conv, user)
-- ARGV[1]   the read position to send (integer >= 0)
-- ARGV[2]   the window in milliseconds
-- ARGV[3]   how long to keep KEYS[2], in seconds
-- Returns 1: send it now (the window starts); 0: a receipt at or above it
-- was sent already; -n: wait n ms (the window is open) and ask again.
local read = tonumber(ARGV[1])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if read <= last then
  return 0
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then
  return -pttl
end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
return 1
