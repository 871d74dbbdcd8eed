-- receipt_gate: coalesces read receipts of one (conversation, user) over
-- every gateway: at most one is sent per window, never one that does not
-- advance past the last one sent, and a read asked about while the window
-- is open is kept as pending, so that whoever asks once it closed sends
-- the newest.
-- KEYS[1]   the window key of (conv, user) (exists while a receipt was sent
--           less than a window ago)
-- KEYS[2]   the last read position sent for (conv, user)
-- KEYS[3]   the newest read position asked about while the window was open
-- ARGV[1]   the read position to send (integer >= 0)
-- ARGV[2]   the window in milliseconds
-- ARGV[3]   how long to keep KEYS[2], in seconds
-- Returns n > 0: send read position n now (the window starts; n is the
-- newer of ARGV[1] and the pending one); 0: a receipt at or above it was
-- sent already; -n: wait n ms (the window is open) and ask again.
local read = tonumber(ARGV[1])
local pending = tonumber(redis.call('GET', KEYS[3]) or '0')
if pending > read then
  read = pending
end
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if read <= last then
  return 0
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then
  if read > pending then
    -- Kept a window past this one's end: whoever asks then finds it.
    redis.call('SET', KEYS[3], read, 'PX', pttl + tonumber(ARGV[2]))
  end
  return -pttl
end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
redis.call('SET', KEYS[2], read, 'EX', ARGV[3])
if pending > 0 then
  redis.call('DEL', KEYS[3])
end
return read
