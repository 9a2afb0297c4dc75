package options

import (
	"errors"
	"testing"
)

type testOptions struct{ Size int }

func (o *testOptions) EnsureDefaults() {
	if o.Size == 0 {
		o.Size = 4
	}
}

func (o *testOptions) Validate() error {
	if o.Size < 0 {
		return errors.New("size below zero")
	}
	return nil
}

func TestResolve(t *testing.T) {
	o, err := Resolve((*testOptions)(nil))
	if err != nil || o.Size != 4 {
		t.Fatalf("nil options: %+v %v", o, err)
	}
	in := &testOptions{Size: 7}
	if o, err := Resolve(in); err != nil || o.Size != 7 {
		t.Fatalf("given options: %+v %v", o, err)
	}
	in = &testOptions{}
	if o, _ := Resolve(in); o.Size != 4 || in.Size != 0 {
		t.Fatalf("defaults went into the caller's value: resolved %+v, caller's %+v", o, in)
	}
	if _, err := Resolve(&testOptions{Size: -1}); err == nil {
		t.Fatal("invalid options resolved")
	}
}
