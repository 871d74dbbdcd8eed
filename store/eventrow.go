package store

import "github.com/jackc/pgx/v5/pgtype"

// eventColumns is the select list of one row of events (aliased e) as an
// Event: the one list that every read of events selects (sync's pages,
// both forms of a snapshot), scanned by eventScan. A column added to the
// event map is added here, to eventScan.dest and to noEventColumns, and
// every read returns it.
const eventColumns = `e.seq, e.kind, e.sender, coalesce(e.cmid, '') AS cmid, coalesce(e.body, ''::bytea) AS body, e.ts,
	e.recalled_by IS NOT NULL AS recalled, coalesce(e.target, 0) AS target, e.users, e.mentions,
	coalesce(e.edited_ts, 0) AS edited, e.attrs`

// noEventColumns has eventColumns' types and no event: the columns of the
// rows of a UNION that carry none.
const noEventColumns = `0::bigint, 0::smallint, ''::text, ''::text, ''::bytea, 0::bigint,
	false, 0::bigint, NULL::text[], NULL::text[],
	0::bigint, NULL::jsonb`

// eventScan scans eventColumns into an Event. Its scan targets belong to
// the statement, not the row (their addresses escape into Scan: declared
// per row they cost allocations on every row); reset starts each row from
// zero values, so nothing of one row (a body, an array Scan could reuse)
// reaches the next. A conversation has few senders: each sender's string
// is made once per statement.
type eventScan struct {
	e       Event
	sender  pgtype.DriverBytes // valid until the next row
	attrs   []byte
	senders map[string]string
}

// dest are the scan targets of eventColumns, in their order.
func (s *eventScan) dest() []any {
	return []any{&s.e.Seq, &s.e.Kind, &s.sender, &s.e.Cmid, &s.e.Body, &s.e.Ts,
		&s.e.Recalled, &s.e.Target, &s.e.Users, &s.e.Mentions,
		&s.e.Edited, &s.attrs}
}

// reset clears the targets before a row is scanned.
func (s *eventScan) reset() { s.e, s.sender, s.attrs = Event{}, nil, nil }

// event returns the scanned row as conv's event, as clients see it: an
// update's changes decoded, a recalled message without its body.
func (s *eventScan) event(conv string) (Event, error) {
	e := s.e
	e.Conv = conv
	if e.Sender = s.senders[string(s.sender)]; e.Sender == "" && len(s.sender) > 0 {
		if s.senders == nil {
			s.senders = map[string]string{}
		}
		e.Sender = string(s.sender)
		s.senders[e.Sender] = e.Sender
	}
	if err := e.Update.decode(s.attrs); err != nil {
		return Event{}, err
	}
	if e.Recalled {
		e.Body = nil
	}
	return e, nil
}
