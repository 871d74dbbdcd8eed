-- Device lifecycle: a suspended user cannot authenticate; a revoked
-- device keeps its row (so neither its old token nor a JWT naming it can
-- bring it back) but has no token any more.
ALTER TABLE users ADD COLUMN suspended boolean NOT NULL DEFAULT false;
ALTER TABLE devices ADD COLUMN revoked_at timestamptz;
