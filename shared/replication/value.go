package replication

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// DatumState says whether a column carries a value, SQL NULL, or nothing at
// all because pgoutput did not send an unchanged TOASTed value.
type DatumState uint8

const (
	// Null is SQL NULL (pgoutput 'n').
	Null DatumState = iota
	// Unchanged is an unchanged TOASTed value that was not sent (pgoutput 'u').
	// It only appears in the new tuple of an UPDATE and means "keep what you
	// had". It is never the same thing as Null.
	Unchanged
	// Present means Value holds the decoded column value.
	Present
)

func (s DatumState) String() string {
	switch s {
	case Null:
		return "null"
	case Unchanged:
		return "unchanged-toast"
	case Present:
		return "present"
	}
	return fmt.Sprintf("DatumState(%d)", uint8(s))
}

// Datum is one column of a decoded row.
//
// Value holds, by column type: bool; int64 (int2, int4, int8, oid, xid);
// float64 (float4, float8, numeric — numeric is converted, so very large or
// very precise numerics lose precision); string (text, varchar, bpchar, name,
// char, json, jsonb and every type not listed here, as PostgreSQL's text
// output); uuid.UUID; time.Time (timestamp as UTC wall time, timestamptz,
// date); Infinity for ±infinity timestamps and dates; []byte (bytea).
type Datum struct {
	State DatumState
	Value any
}

// Infinity is the value of a timestamp, timestamptz or date column holding
// 'infinity' (+1) or '-infinity' (-1).
type Infinity int8

// Column describes one column of a relation or of a snapshot result.
type Column struct {
	Name    string
	TypeOID uint32
	TypeMod int32
	// Key is set for replica-identity key columns (relation messages only).
	Key bool
}

// columnSet is an ordered column list with a name index, shared by every row
// of one relation version or one result set.
type columnSet struct {
	cols  []Column
	index map[string]int
}

func newColumnSet(cols []Column) *columnSet {
	cs := &columnSet{cols: cols, index: make(map[string]int, len(cols))}
	for i, c := range cols {
		cs.index[c.Name] = i
	}
	return cs
}

// Row is a decoded tuple: one Datum per column of its relation (or result
// set), in column order. The zero Row has no columns.
type Row struct {
	cols   *columnSet
	values []Datum
}

// Errors returned by the typed Row accessors; they wrap a *ColumnError.
var (
	ErrNoColumn  = errors.New("no such column")
	ErrNull      = errors.New("column is NULL")
	ErrUnchanged = errors.New("column is an unchanged TOAST value (not sent)")
	ErrType      = errors.New("column has a different type")
)

// ColumnError names the column an accessor failed on.
type ColumnError struct {
	Column string
	Err    error
	Got    any
}

func (e *ColumnError) Error() string {
	if e.Got != nil {
		return fmt.Sprintf("column %q: %v (got %T)", e.Column, e.Err, e.Got)
	}
	return fmt.Sprintf("column %q: %v", e.Column, e.Err)
}

func (e *ColumnError) Unwrap() error { return e.Err }

// IsZero reports whether the row is absent (e.g. no old tuple was sent).
func (r Row) IsZero() bool { return r.cols == nil }

// Len is the number of columns.
func (r Row) Len() int { return len(r.values) }

// Columns returns the row's column descriptions (do not modify).
func (r Row) Columns() []Column {
	if r.cols == nil {
		return nil
	}
	return r.cols.cols
}

// At returns the i-th datum.
func (r Row) At(i int) Datum { return r.values[i] }

// Get returns the named column's datum and whether the column exists.
func (r Row) Get(name string) (Datum, bool) {
	if r.cols == nil {
		return Datum{}, false
	}
	i, ok := r.cols.index[name]
	if !ok {
		return Datum{}, false
	}
	return r.values[i], true
}

// Has reports whether the named column exists and carries a value (it is
// neither NULL nor an unchanged TOAST value).
func (r Row) Has(name string) bool {
	d, ok := r.Get(name)
	return ok && d.State == Present
}

// Map returns the row as column name → datum (for logging and tests).
func (r Row) Map() map[string]Datum {
	m := make(map[string]Datum, len(r.values))
	for i, c := range r.Columns() {
		m[c.Name] = r.values[i]
	}
	return m
}

func (r Row) present(name string) (any, error) {
	d, ok := r.Get(name)
	if !ok {
		return nil, &ColumnError{Column: name, Err: ErrNoColumn}
	}
	switch d.State {
	case Null:
		return nil, &ColumnError{Column: name, Err: ErrNull}
	case Unchanged:
		return nil, &ColumnError{Column: name, Err: ErrUnchanged}
	}
	return d.Value, nil
}

// String returns a text-like column.
func (r Row) String(name string) (string, error) {
	v, err := r.present(name)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", &ColumnError{Column: name, Err: ErrType, Got: v}
	}
	return s, nil
}

// Int64 returns an integer column.
func (r Row) Int64(name string) (int64, error) {
	v, err := r.present(name)
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, &ColumnError{Column: name, Err: ErrType, Got: v}
	}
	return n, nil
}

// Float64 returns a float or numeric column (integers are converted).
func (r Row) Float64(name string) (float64, error) {
	v, err := r.present(name)
	if err != nil {
		return 0, err
	}
	switch x := v.(type) {
	case float64:
		return x, nil
	case int64:
		return float64(x), nil
	}
	return 0, &ColumnError{Column: name, Err: ErrType, Got: v}
}

// Bool returns a boolean column.
func (r Row) Bool(name string) (bool, error) {
	v, err := r.present(name)
	if err != nil {
		return false, err
	}
	b, ok := v.(bool)
	if !ok {
		return false, &ColumnError{Column: name, Err: ErrType, Got: v}
	}
	return b, nil
}

// Time returns a timestamp, timestamptz or date column.
func (r Row) Time(name string) (time.Time, error) {
	v, err := r.present(name)
	if err != nil {
		return time.Time{}, err
	}
	t, ok := v.(time.Time)
	if !ok {
		return time.Time{}, &ColumnError{Column: name, Err: ErrType, Got: v}
	}
	return t, nil
}

// UUID returns a uuid column.
func (r Row) UUID(name string) (uuid.UUID, error) {
	v, err := r.present(name)
	if err != nil {
		return uuid.UUID{}, err
	}
	u, ok := v.(uuid.UUID)
	if !ok {
		return uuid.UUID{}, &ColumnError{Column: name, Err: ErrType, Got: v}
	}
	return u, nil
}

// PostgreSQL type OIDs the decoder knows (pg_type.dat).
const (
	oidBool        = 16
	oidBytea       = 17
	oidChar        = 18
	oidName        = 19
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidText        = 25
	oidOID         = 26
	oidXID         = 28
	oidJSON        = 114
	oidFloat4      = 700
	oidFloat8      = 701
	oidBPChar      = 1042
	oidVarchar     = 1043
	oidDate        = 1082
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidNumeric     = 1700
	oidUUID        = 2950
	oidJSONB       = 3802
)

// DecodeText converts PostgreSQL's text output of a value of type oid into
// the Go value documented on Datum. Types it does not know are returned as
// their text. The connection must use DateStyle ISO and bytea_output hex,
// which Stream sets on its replication connections.
func DecodeText(oid uint32, b []byte) (any, error) {
	switch oid {
	case oidBool:
		switch string(b) {
		case "t":
			return true, nil
		case "f":
			return false, nil
		}
		return nil, fmt.Errorf("bad bool %q", b)
	case oidInt2, oidInt4, oidInt8, oidOID, oidXID:
		n, err := strconv.ParseInt(string(b), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad integer %q: %w", b, err)
		}
		return n, nil
	case oidFloat4, oidFloat8, oidNumeric:
		f, err := strconv.ParseFloat(string(b), 64)
		if err != nil {
			return nil, fmt.Errorf("bad number %q: %w", b, err)
		}
		return f, nil
	case oidUUID:
		u, err := uuid.ParseBytes(b)
		if err != nil {
			return nil, fmt.Errorf("bad uuid %q: %w", b, err)
		}
		return u, nil
	case oidTimestamptz:
		var t pgtype.Timestamptz
		if err := t.Scan(string(b)); err != nil {
			return nil, fmt.Errorf("bad timestamptz %q: %w", b, err)
		}
		return timeOrInfinity(t.Time, t.InfinityModifier), nil
	case oidTimestamp:
		var t pgtype.Timestamp
		if err := t.Scan(string(b)); err != nil {
			return nil, fmt.Errorf("bad timestamp %q: %w", b, err)
		}
		return timeOrInfinity(t.Time, t.InfinityModifier), nil
	case oidDate:
		var d pgtype.Date
		if err := d.Scan(string(b)); err != nil {
			return nil, fmt.Errorf("bad date %q: %w", b, err)
		}
		return timeOrInfinity(d.Time, d.InfinityModifier), nil
	case oidBytea:
		if len(b) < 2 || b[0] != '\\' || b[1] != 'x' {
			return nil, fmt.Errorf("bad bytea (want hex output) %.20q", b)
		}
		out := make([]byte, hex.DecodedLen(len(b)-2))
		if _, err := hex.Decode(out, b[2:]); err != nil {
			return nil, fmt.Errorf("bad bytea: %w", err)
		}
		return out, nil
	default:
		return string(b), nil
	}
}

func timeOrInfinity(t time.Time, m pgtype.InfinityModifier) any {
	switch m {
	case pgtype.Infinity:
		return Infinity(1)
	case pgtype.NegativeInfinity:
		return Infinity(-1)
	}
	return t
}

// NewRow builds a row from columns and values (len(values) must equal
// len(cols)). Consumers use it to build synthetic transactions in their
// tests; the stream builds rows itself.
func NewRow(cols []Column, values []Datum) Row {
	if len(values) != len(cols) {
		panic(fmt.Sprintf("replication.NewRow: %d values for %d columns", len(values), len(cols)))
	}
	return Row{cols: newColumnSet(cols), values: values}
}

// RowBuilder makes rows of one fixed column set cheaply (the name index is
// shared by every row it builds).
type RowBuilder struct{ cs *columnSet }

// NewRowBuilder returns a builder for rows with these columns.
func NewRowBuilder(cols []Column) RowBuilder { return RowBuilder{cs: newColumnSet(cols)} }

// Row builds one row; len(values) must equal the number of columns.
func (b RowBuilder) Row(values ...Datum) Row {
	if len(values) != len(b.cs.cols) {
		panic(fmt.Sprintf("replication.RowBuilder: %d values for %d columns", len(values), len(b.cs.cols)))
	}
	return Row{cols: b.cs, values: values}
}

// Value is a Present datum holding v.
func Value(v any) Datum { return Datum{State: Present, Value: v} }
