-- Parley schema, version 1.
-- Every table leads with its conversation or user key (devices with the
-- device id), so each can be hash partitioned or distributed by that key.

CREATE TABLE users (
    user_id    text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE devices (
    device_id     text PRIMARY KEY,
    user_id       text NOT NULL REFERENCES users,
    token_sha256  bytea NOT NULL,
    install_epoch integer NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX devices_by_user ON devices (user_id);

CREATE TABLE conversations (
    conv_id      text PRIMARY KEY,
    kind         text NOT NULL CHECK (kind IN ('group', 'direct')),
    title        text NOT NULL DEFAULT '',
    epoch        integer NOT NULL DEFAULT 1,
    min_seq      bigint NOT NULL DEFAULT 1,
    member_count integer NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per membership period: it opens at the join event's seq and
-- closes (to_seq) at the leave event's seq; NULL while the user is a member.
CREATE TABLE membership_periods (
    conv_id  text NOT NULL,
    user_id  text NOT NULL,
    from_seq bigint NOT NULL,
    to_seq   bigint,
    PRIMARY KEY (conv_id, user_id, from_seq),
    CHECK (to_seq IS NULL OR to_seq >= from_seq)
);
CREATE UNIQUE INDEX membership_current ON membership_periods (conv_id, user_id) WHERE to_seq IS NULL;
CREATE INDEX membership_by_user ON membership_periods (user_id, conv_id);

-- The conversation log. kind: 0 hole (a seq that was allocated but will
-- never hold an event; see docs/consistency.md), 1 msg, 2 join, 3 leave,
-- 4 recall. One copy of each body.
CREATE TABLE events (
    conv_id     text NOT NULL,
    seq         bigint NOT NULL,
    kind        smallint NOT NULL,
    sender      text NOT NULL DEFAULT '',
    cmid        text,
    body        bytea,
    ts          bigint NOT NULL,
    recalled_by bigint,
    target      bigint,
    users       text[],
    PRIMARY KEY (conv_id, seq)
);
CREATE UNIQUE INDEX events_by_cmid ON events (conv_id, sender, cmid) WHERE cmid IS NOT NULL;

CREATE TABLE device_cursors (
    device_id     text NOT NULL,
    conv_id       text NOT NULL,
    install_epoch integer NOT NULL,
    delivered_seq bigint NOT NULL CHECK (delivered_seq >= 0),
    PRIMARY KEY (device_id, conv_id)
);

CREATE TABLE read_positions (
    user_id  text NOT NULL,
    conv_id  text NOT NULL,
    read_seq bigint NOT NULL CHECK (read_seq >= 0),
    PRIMARY KEY (user_id, conv_id)
);
