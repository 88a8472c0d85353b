package replication

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// Hand-built pgoutput protocol-1 messages.

func msgBegin(final LSN, xid uint32) []byte {
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, uint64(final))
	b = binary.BigEndian.AppendUint64(b, 0)
	return binary.BigEndian.AppendUint32(b, xid)
}

func msgCommit(commit, end LSN) []byte {
	b := []byte{'C', 0}
	b = binary.BigEndian.AppendUint64(b, uint64(commit))
	b = binary.BigEndian.AppendUint64(b, uint64(end))
	return binary.BigEndian.AppendUint64(b, 0)
}

func msgRelation(id uint32, table string, cols ...Column) []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, id)
	b = append(b, "public\x00"...)
	b = append(b, table+"\x00"...)
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		f := byte(0)
		if c.Key {
			f = 1
		}
		b = append(b, f)
		b = append(b, c.Name+"\x00"...)
		b = binary.BigEndian.AppendUint32(b, c.TypeOID)
		b = binary.BigEndian.AppendUint32(b, 0xffffffff)
	}
	return b
}

func msgInsert(rel uint32, vals ...string) []byte {
	b := []byte{'I'}
	b = binary.BigEndian.AppendUint32(b, rel)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
	for _, v := range vals {
		switch v {
		case "\x00null":
			b = append(b, 'n')
		case "\x00toast":
			b = append(b, 'u')
		default:
			b = append(b, 't')
			b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

var testCols = []Column{{Name: "id", TypeOID: oidInt4, Key: true}, {Name: "name", TypeOID: oidText}}

func TestDecoderAssemblesATransaction(t *testing.T) {
	d := newDecoder()
	steps := []struct {
		lsn  LSN
		data []byte
	}{
		{100, msgBegin(300, 7)},
		{0, msgRelation(42, "item", testCols...)},
		{200, msgInsert(42, "5", "\x00null")},
		{250, msgInsert(42, "6", "\x00toast")},
		{300, msgCommit(300, 340)},
	}
	var txn *Transaction
	for _, s := range steps {
		var err error
		if txn, err = d.handle(s.lsn, s.data); err != nil {
			t.Fatal(err)
		}
	}
	if txn == nil || txn.XID != 7 || txn.BeginLSN != 100 || txn.CommitLSN != 300 || txn.EndLSN != 340 || len(txn.Changes) != 2 {
		t.Fatalf("txn = %+v", txn)
	}
	c := txn.Changes[0]
	if id, _ := c.New.Int64("id"); id != 5 || c.Relation.QualifiedName() != "public.item" {
		t.Fatalf("change = %+v", c)
	}
	if dn, _ := c.New.Get("name"); dn.State != Null {
		t.Fatalf("name = %v", dn.State)
	}
	if dn, _ := txn.Changes[1].New.Get("name"); dn.State != Unchanged {
		t.Fatalf("name = %v", dn.State)
	}
	if d.inTxn() {
		t.Fatal("still in a transaction after COMMIT")
	}
}

// Every malformed input yields a DecodeError carrying the message's LSN; none
// panics and none is skipped silently.
func TestDecoderRejectsMalformedMessages(t *testing.T) {
	withRel := func() *decoder {
		d := newDecoder()
		if _, err := d.handle(0, msgRelation(42, "item", testCols...)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	inTxn := func() *decoder {
		d := withRel()
		if _, err := d.handle(10, msgBegin(500, 1)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	full := msgInsert(42, "1", "abc")
	cases := []struct {
		name string
		d    *decoder
		data []byte
		want string
	}{
		{"empty", newDecoder(), nil, "empty message"},
		{"unknown type", newDecoder(), []byte{'Z', 1, 2}, "not supported"},
		{"truncated insert", inTxn(), full[:len(full)-2], "truncated or corrupt"},
		{"short begin", newDecoder(), []byte{'B', 0, 0}, "BeginMessage"},
		{"unknown relation", inTxn(), msgInsert(99, "1", "x"), "relation 99"},
		{"bad integer", inTxn(), msgInsert(42, "abc", "x"), `column "id"`},
		{"column count", inTxn(), msgInsert(42, "1"), "1 columns"},
		{"change outside txn", withRel(), msgInsert(42, "1", "x"), "outside a transaction"},
		{"commit without begin", newDecoder(), msgCommit(1, 2), "COMMIT without BEGIN"},
		{"commit mismatch", inTxn(), msgCommit(499, 520), "does not match"},
		{"nested begin", inTxn(), msgBegin(600, 2), "inside transaction"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const at = LSN(0x1234ABCD)
			txn, err := c.d.handle(at, c.data)
			var de *DecodeError
			if !errors.As(err, &de) || de.LSN != at || txn != nil {
				t.Fatalf("handle = %v, %v; want a DecodeError at %s", txn, err, at)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), at.String()) {
				t.Fatalf("error %q does not say %q and the LSN", err, c.want)
			}
		})
	}
}

func TestDecodeTextEdgeCases(t *testing.T) {
	if v, err := DecodeText(oidTimestamptz, []byte("infinity")); err != nil || v != Infinity(1) {
		t.Fatalf("infinity = %v, %v", v, err)
	}
	if v, err := DecodeText(oidDate, []byte("-infinity")); err != nil || v != Infinity(-1) {
		t.Fatalf("-infinity = %v, %v", v, err)
	}
	if v, err := DecodeText(oidNumeric, []byte("NaN")); err != nil || v.(float64) == v.(float64) {
		t.Fatalf("NaN = %v, %v", v, err)
	}
	if v, err := DecodeText(3220 /* pg_lsn */, []byte("0/16B3748")); err != nil || v != "0/16B3748" {
		t.Fatalf("unknown type = %v, %v", v, err)
	}
	for _, c := range []struct {
		oid uint32
		in  string
	}{{oidBool, "yes"}, {oidInt8, "1.5"}, {oidUUID, "nope"}, {oidBytea, "abc"}, {oidTimestamptz, "soon"}, {oidFloat8, "x"}} {
		if _, err := DecodeText(c.oid, []byte(c.in)); err == nil {
			t.Errorf("DecodeText(%d, %q) accepted bad input", c.oid, c.in)
		}
	}
}
