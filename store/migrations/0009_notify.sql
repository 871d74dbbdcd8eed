-- Notifications to devices that are not reading (docs/notifications.md).

-- One notification address per device: a new registration replaces the
-- old one; reinstalling or revoking the device deletes it. Led by the
-- device id like devices; notify_registrations_by_user finds a user's.
CREATE TABLE notify_registrations (
    device_id     text PRIMARY KEY REFERENCES devices ON DELETE CASCADE,
    user_id       text NOT NULL,
    provider      text NOT NULL CHECK (provider IN ('apns', 'fcm', 'webhook')),
    token         text NOT NULL,
    sandbox       boolean NOT NULL DEFAULT false,
    registered_at bigint NOT NULL
);
CREATE INDEX notify_registrations_by_user ON notify_registrations (user_id);

-- Per-user conversation settings: muted_until is Unix ms (0 or past: not
-- muted).
CREATE TABLE conv_settings (
    user_id     text NOT NULL,
    conv_id     text NOT NULL,
    muted_until bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, conv_id)
);

-- The users a message mentions (current members at send time); NULL when
-- none.
ALTER TABLE events ADD COLUMN mentions text[];
