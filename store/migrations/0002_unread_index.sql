-- Unread counting (docs/consistency.md, "Unread counts") reads only this
-- index: visible, not-recalled messages by seq, with the sender to exclude
-- one's own.
CREATE INDEX events_unread ON events (conv_id, seq) INCLUDE (sender) WHERE kind = 1 AND recalled_by IS NULL;
