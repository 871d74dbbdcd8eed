-- Exact unread counts without scanning every unread message.
--
-- dense_seq is a lower bound of the conversation's committed watermark:
-- every seq <= dense_seq holds a row (an event or a hole). Fan-out advances
-- it after each commit batch. Below it, the number of events in a seq range
-- is simply the range's width, so
--   unread(lo, hi] = (hi - lo) - rows that do not count
-- where the rows that do not count for user u are the few non-msg events
-- (join, leave, recall, hole), recalled messages, and u's own messages,
-- each counted on a small partial index. Above dense_seq (the last few seqs,
-- some maybe in flight) the messages are counted directly.
ALTER TABLE conversations ADD COLUMN dense_seq bigint NOT NULL DEFAULT 0;

DROP INDEX events_unread;
CREATE INDEX events_not_counted ON events (conv_id, seq) WHERE kind <> 1 OR recalled_by IS NOT NULL;
CREATE INDEX events_by_sender ON events (conv_id, sender, seq) WHERE kind = 1 AND recalled_by IS NULL;

-- parley_unread(conv, user, read): the number of msg events of conv inside
-- one of user's membership periods, not recalled, not sent by user, with
-- seq > read (docs/consistency.md, "Unread counts"). STABLE: it sees the
-- calling statement's snapshot, so it agrees with the head and read read
-- beside it.
CREATE FUNCTION parley_unread(p_conv text, p_user text, p_read bigint) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    w     bigint;
    head  bigint;
    lo    bigint;
    hi    bigint;
    mid   bigint;
    total bigint := 0;
    p     record;
BEGIN
    SELECT dense_seq INTO w FROM conversations WHERE conv_id = p_conv;
    SELECT coalesce(max(seq), 0) INTO head FROM events WHERE conv_id = p_conv;
    FOR p IN SELECT from_seq, to_seq FROM membership_periods
              WHERE conv_id = p_conv AND user_id = p_user AND coalesce(to_seq, head) > p_read
    LOOP
        lo := greatest(p_read, p.from_seq - 1);          -- exclusive
        hi := least(coalesce(p.to_seq, head), head);      -- inclusive
        CONTINUE WHEN hi <= lo;
        mid := least(hi, greatest(lo, w));
        IF mid > lo THEN
            total := total + (mid - lo)
                - (SELECT count(*) FROM events e WHERE e.conv_id = p_conv AND e.seq > lo AND e.seq <= mid
                      AND (e.kind <> 1 OR e.recalled_by IS NOT NULL))
                - (SELECT count(*) FROM events e WHERE e.conv_id = p_conv AND e.sender = p_user AND e.seq > lo AND e.seq <= mid
                      AND e.kind = 1 AND e.recalled_by IS NULL);
        END IF;
        IF hi > mid THEN
            total := total + (SELECT count(*) FROM events e WHERE e.conv_id = p_conv AND e.seq > mid AND e.seq <= hi
                      AND e.kind = 1 AND e.recalled_by IS NULL AND e.sender <> p_user);
        END IF;
    END LOOP;
    RETURN total;
END $$;
