-- Room on each page for the next version of a row.
--
-- Delivery cursors, read positions and conversation rows are updated in
-- place over and over (a cursor about once a second per device and active
-- conversation). An update that finds room on the row's own page is a HOT
-- update: no new index entry, and its WAL record carries only the changed
-- bytes. Packed pages (fillfactor 100) left no room until a later visit
-- pruned them, so most cursor updates also inserted a primary key entry.
-- Applies to pages written from now on (VACUUM FULL rewrites old ones).
ALTER TABLE device_cursors SET (fillfactor = 70);
ALTER TABLE read_positions SET (fillfactor = 70);
ALTER TABLE conversations SET (fillfactor = 80);
