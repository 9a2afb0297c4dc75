package api

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fill sets every field of v to a value of its own.
func fill(v reflect.Value, seed *int) {
	*seed++
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Unix(int64(*seed)*1000, 0).UTC()))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			fill(v.Field(i), seed)
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), seed)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fill(v.Index(0), seed)
		fill(v.Index(1), seed)
	case reflect.String:
		v.SetString("s" + string(rune('a'+*seed%26)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*seed))
	case reflect.Uint64:
		v.SetUint(uint64(*seed))
	case reflect.Float64:
		v.SetFloat(float64(*seed) + 0.5)
	default:
		panic("fill: " + v.Type().String())
	}
}

// TestLinkStatusRoundTrips: every field of a link's report crosses JSON
// and comes back (the shipper reports in this type, the CLI decodes it),
// under the contract's names.
func TestLinkStatusRoundTrips(t *testing.T) {
	var s LinkStatus
	seed := 0
	fill(reflect.ValueOf(&s).Elem(), &seed)
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back LinkStatus
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s, back) {
		t.Fatalf("a link's report does not round-trip:\nsent %+v\ngot  %+v", s, back)
	}
	for _, name := range []string{`"acked_index"`, `"entries_behind"`, `"peer_limits"`, `"antientropy"`, `"kept_tombstones"`,
		`"backfill"`, `"reseed"`, `"bandwidth_limit"`, `"identity_conflict"`} {
		if !strings.Contains(string(b), name) {
			t.Errorf("the report lacks %s: %s", name, b)
		}
	}
}
