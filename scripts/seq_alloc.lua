-- seq_alloc: allocate n consecutive seqs of one conversation.
-- KEYS[1]  the conversation's seq counter ({conv}-tagged)
-- ARGV[1]  n, how many seqs to allocate (>= 1)
-- Returns the last allocated seq (the first is last - n + 1), or -1 when
-- the counter is missing (Redis lost it): the caller re-seeds it from
-- PostgreSQL with seq_floor and tries again. A missing counter is never
-- silently restarted at 1.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
return redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
