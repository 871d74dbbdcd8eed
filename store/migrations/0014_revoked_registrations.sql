-- A revoked device's notification registration is deleted with the
-- revocation (store.RevokeDevice); delete those of devices revoked before.
DELETE FROM notify_registrations r USING devices d
 WHERE d.device_id = r.device_id AND d.revoked_at IS NOT NULL;
