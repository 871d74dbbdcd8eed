-- Message edits, "delete for me", and private read receipts.
--
-- An edit is an event of its own (kind 5: target, the new body, the
-- editor as sender). The edited message keeps its row: its body is
-- replaced, edited_ts is the newest edit's ts and edited_by its seq (so a
-- retried edit with the same body is answered with that seq instead of
-- appending again). Neither column is read by unread counting: an edit is
-- never a kind 1 row, so it is one of the rows events_not_counted lists.
--
-- cleared_seq is a user's "delete for me" position in a conversation
-- (max-merged, written under the user's read lock like read_seq, and never
-- above it): the user's devices are given no event at or below it.
-- users.receipts_private: the user's read positions are not shown to
-- other members (receipts, receipt pushes).
-- Every new column is nullable or has a constant default: adding them
-- rewrites no rows.

ALTER TABLE events ADD COLUMN edited_ts bigint, ADD COLUMN edited_by bigint;
ALTER TABLE read_positions ADD COLUMN cleared_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN receipts_private boolean NOT NULL DEFAULT false;
