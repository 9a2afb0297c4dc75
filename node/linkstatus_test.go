package node

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// fill sets every field of v to a value of its own, so a field the
// conversion drops shows up as a difference.
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

// TestLinkStatusCarriesEveryField: the API's LinkStatus (package client,
// which the CLI decodes) says everything the shipper's Status does, under
// the same JSON names.
func TestLinkStatusCarriesEveryField(t *testing.T) {
	var s transport.Status
	seed := 0
	fill(reflect.ValueOf(&s).Elem(), &seed)
	if s.Limits == nil || *s.Limits == (wire.Limits{}) {
		t.Fatal("fill left the limits empty")
	}
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(linkStatus(s))
	if err != nil {
		t.Fatal(err)
	}
	var w, g map[string]any
	json.Unmarshal(want, &w)
	json.Unmarshal(got, &g)
	if !reflect.DeepEqual(w, g) {
		t.Fatalf("the API's link status differs from the shipper's:\nshipper %s\napi     %s", want, got)
	}
}
