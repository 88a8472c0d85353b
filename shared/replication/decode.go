package replication

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// LSN is a WAL position.
type LSN = pglogrepl.LSN

// Relation is a table as described by the latest pgoutput RelationMessage
// for its OID on the current connection. A new Relation value replaces the
// old one when the table's shape changes (ALTER TABLE), so a *Relation held
// by a Change always matches that change's rows.
type Relation struct {
	ID     uint32
	Schema string
	Table  string
	// ReplicaIdentity is 'd' (default: primary key), 'n' (nothing), 'f'
	// (full) or 'i' (index).
	ReplicaIdentity byte
	cols            *columnSet
}

// Columns returns the relation's columns in table order (do not modify).
func (r *Relation) Columns() []Column { return r.cols.cols }

// QualifiedName is schema.table.
func (r *Relation) QualifiedName() string { return r.Schema + "." + r.Table }

// Op is the kind of a Change.
type Op uint8

const (
	Insert Op = iota + 1
	Update
	Delete
	Truncate
)

func (o Op) String() string {
	switch o {
	case Insert:
		return "insert"
	case Update:
		return "update"
	case Delete:
		return "delete"
	case Truncate:
		return "truncate"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Change is one row change (or one truncated table) inside a Transaction.
type Change struct {
	Op       Op
	Relation *Relation
	// New is the new row of an Insert or Update. In an Update, a column can be
	// Unchanged (TOAST not sent): keep the previous value.
	New Row
	// Old is the old key ('K': only replica-identity columns are set, the
	// others are Null) or the whole old row ('O', REPLICA IDENTITY FULL) of an
	// Update whose key changed or of a Delete. Zero when not sent.
	Old     Row
	OldKind byte
	// TruncateCascade / TruncateRestartIdentity are the TRUNCATE options.
	TruncateCascade         bool
	TruncateRestartIdentity bool
	// LSN is the WAL position of the message. Row positions are not monotonic
	// across transactions; use it for logging only.
	LSN LSN
}

// Transaction is one committed source transaction, delivered whole and in
// commit order.
type Transaction struct {
	XID uint32
	// BeginLSN is the stream position of the BEGIN message.
	BeginLSN LSN
	// CommitLSN is the position of the commit record.
	CommitLSN LSN
	// EndLSN is the end of the commit record: the position to acknowledge
	// once the transaction is durable (acknowledging CommitLSN would make the
	// server send the transaction again).
	EndLSN     LSN
	CommitTime time.Time
	Changes    []Change
}

// DecodeError is a pgoutput message that could not be decoded. The stream
// never acknowledges past it: it stops the session and reconnects.
type DecodeError struct {
	LSN     LSN
	MsgType byte
	Err     error
}

func (e *DecodeError) Error() string {
	t := string(rune(e.MsgType))
	if e.MsgType < 0x20 || e.MsgType > 0x7e {
		t = fmt.Sprintf("0x%02x", e.MsgType)
	}
	return fmt.Sprintf("replication: undecodable pgoutput message %s at LSN %s: %v", t, e.LSN, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// decoder assembles pgoutput protocol-1 messages into whole transactions. It
// holds the per-connection relation cache; make a new one per connection.
type decoder struct {
	relations map[uint32]*Relation
	cur       *Transaction
	curFinal  LSN
}

func newDecoder() *decoder { return &decoder{relations: map[uint32]*Relation{}} }

// inTxn reports whether a BEGIN has been seen without its COMMIT.
func (d *decoder) inTxn() bool { return d.cur != nil }

// parse wraps pglogrepl.Parse, which can panic on truncated input.
func parseMessage(data []byte) (m pglogrepl.Message, err error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("empty message")
	}
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("truncated or corrupt message: %v", r)
		}
	}()
	return pglogrepl.Parse(data)
}

// handle consumes one XLogData payload. It returns the transaction when data
// was its COMMIT.
func (d *decoder) handle(walStart LSN, data []byte) (*Transaction, error) {
	var typ byte
	if len(data) > 0 {
		typ = data[0]
	}
	fail := func(err error) (*Transaction, error) {
		return nil, &DecodeError{LSN: walStart, MsgType: typ, Err: err}
	}
	msg, err := parseMessage(data)
	if err != nil {
		return fail(err)
	}
	switch m := msg.(type) {
	case *pglogrepl.BeginMessage:
		if d.cur != nil {
			return fail(fmt.Errorf("BEGIN (xid %d) inside transaction xid %d", m.Xid, d.cur.XID))
		}
		d.cur = &Transaction{XID: m.Xid, BeginLSN: walStart, CommitTime: m.CommitTime}
		d.curFinal = m.FinalLSN
		return nil, nil
	case *pglogrepl.CommitMessage:
		if d.cur == nil {
			return fail(fmt.Errorf("COMMIT without BEGIN"))
		}
		if m.CommitLSN != d.curFinal {
			return fail(fmt.Errorf("COMMIT at %s does not match BEGIN final LSN %s", m.CommitLSN, d.curFinal))
		}
		if m.TransactionEndLSN < m.CommitLSN {
			return fail(fmt.Errorf("COMMIT end LSN %s before commit LSN %s", m.TransactionEndLSN, m.CommitLSN))
		}
		t := d.cur
		d.cur = nil
		t.CommitLSN, t.EndLSN, t.CommitTime = m.CommitLSN, m.TransactionEndLSN, m.CommitTime
		return t, nil
	case *pglogrepl.RelationMessage:
		cols := make([]Column, len(m.Columns))
		for i, c := range m.Columns {
			cols[i] = Column{Name: c.Name, TypeOID: c.DataType, TypeMod: c.TypeModifier, Key: c.Flags&1 != 0}
		}
		d.relations[m.RelationID] = &Relation{
			ID: m.RelationID, Schema: m.Namespace, Table: m.RelationName,
			ReplicaIdentity: m.ReplicaIdentity, cols: newColumnSet(cols),
		}
		return nil, nil
	case *pglogrepl.TypeMessage, *pglogrepl.OriginMessage, *pglogrepl.LogicalDecodingMessage:
		// Custom type names, replication origins and pg_logical_emit_message
		// payloads carry nothing a consumer of table changes needs.
		return nil, nil
	case *pglogrepl.InsertMessage:
		rel, err := d.change(m.RelationID)
		if err != nil {
			return fail(err)
		}
		row, err := decodeTuple(rel, m.Tuple)
		if err != nil {
			return fail(fmt.Errorf("insert into %s: %w", rel.QualifiedName(), err))
		}
		d.cur.Changes = append(d.cur.Changes, Change{Op: Insert, Relation: rel, New: row, LSN: walStart})
		return nil, nil
	case *pglogrepl.UpdateMessage:
		rel, err := d.change(m.RelationID)
		if err != nil {
			return fail(err)
		}
		c := Change{Op: Update, Relation: rel, LSN: walStart, OldKind: m.OldTupleType}
		if c.New, err = decodeTuple(rel, m.NewTuple); err != nil {
			return fail(fmt.Errorf("update of %s (new): %w", rel.QualifiedName(), err))
		}
		if m.OldTuple != nil {
			if c.Old, err = decodeTuple(rel, m.OldTuple); err != nil {
				return fail(fmt.Errorf("update of %s (old): %w", rel.QualifiedName(), err))
			}
		}
		d.cur.Changes = append(d.cur.Changes, c)
		return nil, nil
	case *pglogrepl.DeleteMessage:
		rel, err := d.change(m.RelationID)
		if err != nil {
			return fail(err)
		}
		c := Change{Op: Delete, Relation: rel, LSN: walStart, OldKind: m.OldTupleType}
		if c.Old, err = decodeTuple(rel, m.OldTuple); err != nil {
			return fail(fmt.Errorf("delete from %s: %w", rel.QualifiedName(), err))
		}
		d.cur.Changes = append(d.cur.Changes, c)
		return nil, nil
	case *pglogrepl.TruncateMessage:
		if d.cur == nil {
			return fail(fmt.Errorf("TRUNCATE outside a transaction"))
		}
		for _, id := range m.RelationIDs {
			rel, ok := d.relations[id]
			if !ok {
				return fail(fmt.Errorf("TRUNCATE of relation %d with no RelationMessage", id))
			}
			d.cur.Changes = append(d.cur.Changes, Change{
				Op: Truncate, Relation: rel, LSN: walStart,
				TruncateCascade:         m.Option&pglogrepl.TruncateOptionCascade != 0,
				TruncateRestartIdentity: m.Option&pglogrepl.TruncateOptionRestartIdentity != 0,
			})
		}
		return nil, nil
	default:
		return fail(fmt.Errorf("unexpected message %T (streaming or a newer protocol version?)", msg))
	}
}

func (d *decoder) change(relID uint32) (*Relation, error) {
	if d.cur == nil {
		return nil, fmt.Errorf("row change outside a transaction")
	}
	rel, ok := d.relations[relID]
	if !ok {
		return nil, fmt.Errorf("row change for relation %d with no RelationMessage", relID)
	}
	return rel, nil
}

func decodeTuple(rel *Relation, t *pglogrepl.TupleData) (Row, error) {
	if t == nil {
		return Row{}, fmt.Errorf("missing tuple")
	}
	cols := rel.cols.cols
	if len(t.Columns) != len(cols) {
		return Row{}, fmt.Errorf("tuple has %d columns, relation message has %d", len(t.Columns), len(cols))
	}
	vals := make([]Datum, len(cols))
	for i, c := range t.Columns {
		switch c.DataType {
		case pglogrepl.TupleDataTypeNull:
			vals[i] = Datum{State: Null}
		case pglogrepl.TupleDataTypeToast:
			vals[i] = Datum{State: Unchanged}
		case pglogrepl.TupleDataTypeText:
			v, err := DecodeText(cols[i].TypeOID, c.Data)
			if err != nil {
				return Row{}, fmt.Errorf("column %q (type %d): %w", cols[i].Name, cols[i].TypeOID, err)
			}
			vals[i] = Datum{State: Present, Value: v}
		default:
			return Row{}, fmt.Errorf("column %q: unexpected tuple data kind %q (binary output was not requested)", cols[i].Name, c.DataType)
		}
	}
	return Row{cols: rel.cols, values: vals}, nil
}

// ParseLSN parses the text form of an LSN ("16/B374D848").
func ParseLSN(s string) (LSN, error) { return pglogrepl.ParseLSN(s) }

// NewRelation describes a table, for consumers building synthetic
// transactions in tests.
func NewRelation(id uint32, schema, table string, cols []Column) *Relation {
	return &Relation{ID: id, Schema: schema, Table: table, ReplicaIdentity: 'd', cols: newColumnSet(cols)}
}
