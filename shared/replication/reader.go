package replication

import (
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Reader reads the columns of one row into the fields of a mirror of the
// table: a NULL becomes the zero value, a value the row did not carry (an
// unchanged TOAST value) leaves the field alone, and the first problem (a
// missing column, an unexpected type) is kept in Err, naming Table and the
// column, while later reads do nothing harmful.
type Reader struct {
	Row   Row
	Table string
	Err   error
}

func (r *Reader) fail(col string, err error, got any) {
	if r.Err == nil {
		r.Err = fmt.Errorf("%s: %w", r.Table, &ColumnError{Column: col, Err: err, Got: got})
	}
}

// datum is the column's value, and whether it was sent.
func (r *Reader) datum(col string) (Datum, bool) {
	d, ok := r.Row.Get(col)
	if !ok {
		r.fail(col, ErrNoColumn, nil)
		return d, false
	}
	return d, d.State != Unchanged
}

// Str reads a text or uuid column.
func (r *Reader) Str(col string, dst *string) {
	d, ok := r.datum(col)
	if !ok {
		return
	}
	switch v := d.Value.(type) {
	case nil:
		*dst = ""
	case string:
		*dst = v
	case uuid.UUID:
		*dst = v.String()
	default:
		r.fail(col, ErrType, v)
	}
}

// Int64 reads an integer column (or a numeric one holding a whole number).
func (r *Reader) Int64(col string, dst *int64) {
	d, ok := r.datum(col)
	if !ok {
		return
	}
	switch v := d.Value.(type) {
	case nil:
		*dst = 0
	case int64:
		*dst = v
	case float64:
		if v != float64(int64(v)) {
			r.fail(col, fmt.Errorf("%w: non-integral %v", ErrType, v), nil)
			return
		}
		*dst = int64(v)
	default:
		r.fail(col, ErrType, v)
	}
}

// Bool reads a boolean column.
func (r *Reader) Bool(col string, dst *bool) {
	d, ok := r.datum(col)
	if !ok {
		return
	}
	switch v := d.Value.(type) {
	case nil:
		*dst = false
	case bool:
		*dst = v
	default:
		r.fail(col, ErrType, v)
	}
}

// Time reads a timestamp or date column (±infinity reads as the zero time).
func (r *Reader) Time(col string, dst *time.Time) {
	d, ok := r.datum(col)
	if !ok {
		return
	}
	switch v := d.Value.(type) {
	case nil, Infinity:
		*dst = time.Time{}
	case time.Time:
		*dst = v
	default:
		r.fail(col, ErrType, v)
	}
}

// Key reads a primary-key column, which must be present.
func (r *Reader) Key(col string) string {
	d, ok := r.Row.Get(col)
	if !ok || d.State != Present {
		r.fail(col, fmt.Errorf("primary key missing (state %v)", d.State), nil)
		return ""
	}
	var s string
	r.Str(col, &s)
	return s
}
