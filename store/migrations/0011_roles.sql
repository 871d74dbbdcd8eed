-- Roles and moderation.
--
-- A current member's role and mute live with its membership period (a
-- removal ends both; a member added again starts as a plain, unmuted
-- member): role 0 member, 1 admin, 2 owner; muted_until in unix
-- milliseconds. conversations.invite: 0 any member may add members, 1
-- only the owner and admins. conv_bans lists who may not be added.
-- An update event (kind 6) keeps what it changed in attrs (role,
-- muted_until, banned, title, invite), which no other kind uses.
-- Every new column is nullable or has a constant default: adding them
-- rewrites no rows.

ALTER TABLE membership_periods ADD COLUMN role smallint NOT NULL DEFAULT 0,
                               ADD COLUMN muted_until bigint;
ALTER TABLE conversations ADD COLUMN invite smallint NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN attrs jsonb;

CREATE TABLE conv_bans (
    conv_id   text NOT NULL,
    user_id   text NOT NULL,
    banned_at bigint NOT NULL,
    PRIMARY KEY (conv_id, user_id)
);

-- The creator of a client-created group (the sender of its seq 1 join)
-- owns it, if still a member since then.
UPDATE membership_periods m SET role = 2
  FROM conversations c JOIN events e ON e.conv_key = c.conv_key AND e.seq = 1
 WHERE m.conv_id = c.conv_id AND c.kind = 'group' AND e.sender <> ''
   AND m.user_id = e.sender AND m.from_seq = 1 AND m.to_seq IS NULL;
