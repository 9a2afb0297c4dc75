package store

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

func TestRecordWithContextRoundTrip(t *testing.T) {
	r := Record{Stamp: entry.Stamp{HLC: hlc.Timestamp{Wall: 9}, Origin: "a"}, Value: []byte("value"), Conflicted: true,
		Ctx: entry.Context{{Origin: "a", HLC: hlc.Timestamp{Wall: 9}}, {Origin: "b", HLC: hlc.Timestamp{Wall: 4, Logical: 2}}}}
	got, err := DecodeRecord(AppendRecord(nil, &r))
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip %+v -> %+v, %v", r, got, err)
	}
	b := AppendRecord(nil, &r)
	for n := 0; n < len(b); n++ {
		if _, err := DecodeRecord(b[:n]); err == nil && n < len(b)-len(r.Value) {
			t.Fatalf("a record cut to %d bytes decoded", n)
		}
	}
}

// TestConflictLogPages: records by key, by prefix, since a time, a page at
// a time; by ID; written once under redelivery; removed.
func TestConflictLogPages(t *testing.T) {
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var all []entry.Conflict
	b := s.NewBatch()
	for i := 0; i < 25; i++ {
		key := fmt.Sprintf("p/%02d", i)
		if i >= 20 {
			key = fmt.Sprintf("q/%02d", i)
		}
		c := entry.Conflict{Key: key, Loser: stampAt(int64(i+1), "b"), Winner: stampAt(int64(i+2), "a"), LoserValue: []byte("v"), LoserLen: 1,
			At: hlc.Timestamp{Wall: int64(100 + i)}, Peer: "b", Incoming: true}
		c.ID = entry.ConflictID(c.Key, c.Loser, c.Winner)
		if wrote, err := b.PutConflict(&c); err != nil || !wrote {
			t.Fatalf("put: %v %v", wrote, err)
		}
		if wrote, err := b.PutConflict(&c); err != nil || wrote {
			t.Fatalf("put again in the batch: %v %v", wrote, err)
		}
		all = append(all, c)
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	b.Close()
	b = s.NewBatch()
	if wrote, err := b.PutConflict(&all[3]); err != nil || wrote {
		t.Fatalf("put again after commit: %v %v", wrote, err)
	}
	b.Close()

	var got []entry.Conflict
	after := ""
	for {
		page, next, err := s.Conflicts(ConflictQuery{Prefix: "p/", After: after, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page...)
		if next == "" {
			break
		}
		after = next
	}
	if len(got) != 20 || got[0].Key != "p/00" || got[19].Key != "p/19" {
		t.Fatalf("prefix p/ paged: %d records", len(got))
	}
	if !reflect.DeepEqual(got[5], all[5]) {
		t.Fatalf("record %+v, want %+v", got[5], all[5])
	}
	page, _, err := s.Conflicts(ConflictQuery{Since: hlc.Timestamp{Wall: 122}})
	if err != nil || len(page) != 3 || page[0].Key != "q/22" {
		t.Fatalf("since: %+v %v", page, err)
	}
	page, _, err = s.Conflicts(ConflictQuery{Key: "q/21"})
	if err != nil || len(page) != 1 || page[0].ID != all[21].ID {
		t.Fatalf("key: %+v %v", page, err)
	}
	c, ok, err := s.ConflictByID(all[9].ID)
	if err != nil || !ok || !reflect.DeepEqual(c, all[9]) {
		t.Fatalf("by id: %+v %v %v", c, ok, err)
	}
	b = s.NewBatch()
	if err := b.DeleteConflict(&all[9]); err != nil {
		t.Fatal(err)
	}
	if rs, err := b.ConflictsOf(all[9].Key); err != nil || len(rs) != 0 {
		t.Fatalf("the batch still sees %+v (%v)", rs, err)
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, ok, err := s.ConflictByID(all[9].ID); ok || err != nil {
		t.Fatalf("deleted record still there: %v %v", ok, err)
	}
}
