package wire

import (
	"errors"
	"reflect"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

func treeAnswerSample() *TreeAnswer {
	return &TreeAnswer{Protocol: 1, Sums: [][]byte{make([]byte, 16)}, Collected: hlc.Timestamp{Wall: 5},
		Ranges: []Range{{Start: "a", End: "b", Stamp: hlc.Timestamp{Wall: 3}, Origin: "x"}},
		Versions: []TreeVersion{
			{Key: "k", Stamp: hlc.Timestamp{Wall: 9, Logical: 1}, Origin: "a", Hash: 7, Value: []byte("v"), Whole: true,
				Ctx: []ContextItem{{Origin: "b", Stamp: hlc.Timestamp{Wall: 2}}}},
			{Key: "n", Counter: true, Kind: uint8(entry.KindPlain), Stamp: hlc.Timestamp{Wall: 9}, Origin: "a", Hash: 1, Whole: true,
				Totals: []Component{{Cluster: "a", P: 3}, {Cluster: "b", N: 1}}},
		}}
}

// TestTreeMessagesRoundTrip: what encodes decodes the same; what breaks a
// bound is refused with ErrBadTree.
func TestTreeMessagesRoundTrip(t *testing.T) {
	a := treeAnswerSample()
	b, err := EncodeTree(a)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeTreeAnswer(b)
	if err != nil || !reflect.DeepEqual(got, a) {
		t.Fatalf("answer round trip: %+v %v", got, err)
	}
	for name, r := range map[string]*TreeRequest{
		"no nodes":   {Protocol: 1, Op: TreeSums},
		"no keys":    {Protocol: 1, Op: TreeVersions},
		"empty key":  {Protocol: 1, Op: TreeVersions, Keys: []Key{{Key: ""}}},
		"unknown op": {Protocol: 1, Op: 7, Nodes: []int{0}},
	} {
		b, _ := EncodeTree(r)
		if _, err := DecodeTreeRequest(b); !errors.Is(err, ErrBadTree) {
			t.Errorf("%s: %v", name, err)
		}
	}
	bad := *a
	bad.Versions = []TreeVersion{{Key: "k", Origin: "a", Counter: true, Totals: []Component{{Cluster: "b"}, {Cluster: "a"}}}}
	b, _ = EncodeTree(&bad)
	if _, err := DecodeTreeAnswer(b); !errors.Is(err, ErrBadTree) {
		t.Errorf("totals out of order: %v", err)
	}
	// a five-byte lie about a million versions
	if _, err := DecodeTreeAnswer([]byte{0x81, 0xa1, 'v', 0xdd, 0x00, 0x0f, 0x42, 0x40}); !errors.Is(err, ErrBadTree) {
		t.Errorf("a lying length: %v", err)
	}
}

func FuzzDecodeTreeRequest(f *testing.F) {
	for _, r := range []*TreeRequest{
		{Protocol: 1, Op: TreeSums, Level: 2, Nodes: []int{0, 5, 255}},
		{Protocol: 1, Op: TreeLeaves, Nodes: []int{65535}},
		{Protocol: 1, Op: TreeVersions, Keys: []Key{{Key: "a"}, {Key: "n", Counter: true}}},
	} {
		b, _ := EncodeTree(r)
		f.Add(b)
	}
	f.Add([]byte{0x81, 0xa1, 'n', 0xdd, 0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeTreeRequest(b)
		if err != nil {
			if !errors.Is(err, ErrBadTree) {
				t.Fatalf("an error of no class: %v", err)
			}
			return
		}
		again, err := EncodeTree(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeTreeRequest(again); err != nil {
			t.Fatalf("a decoded request does not decode again: %v", err)
		}
	})
}

func FuzzDecodeTreeAnswer(f *testing.F) {
	b, _ := EncodeTree(treeAnswerSample())
	f.Add(b)
	withFloors := treeAnswerSample()
	withFloors.Versions = append(withFloors.Versions, TreeVersion{Key: "c", Counter: true, Origin: "b", Whole: true,
		Totals: []Component{{Cluster: "b", P: 5}}, Floors: []Component{{Cluster: "b", P: 3}}})
	b, _ = EncodeTree(withFloors)
	f.Add(b)
	f.Add([]byte{0x81, 0xa1, 'v', 0xdd, 0x00, 0x0f, 0x42, 0x40})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeTreeAnswer(b)
		if err != nil {
			if !errors.Is(err, ErrBadTree) {
				t.Fatalf("an error of no class: %v", err)
			}
			return
		}
		for i := range a.Versions {
			if err := a.Versions[i].Check(); err != nil {
				t.Fatalf("a version that breaks its checks was let through: %v", err)
			}
		}
	})
}
