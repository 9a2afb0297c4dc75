package origin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	good := []string{"a", "east-1", "0", "a-b-c", strings.Repeat("x", 63), "us-west-2"}
	bad := []string{"", "-a", "A", "Bad_ID!", "a_b", "a.b", "a b", strings.Repeat("x", 64), "é"}
	for _, id := range good {
		if err := Validate(id); err != nil {
			t.Errorf("Validate(%q) = %v, want ok", id, err)
		}
	}
	for _, id := range bad {
		err := Validate(id)
		if !errors.Is(err, ErrInvalidID) {
			t.Errorf("Validate(%q) = %v, want ErrInvalidID", id, err)
			continue
		}
		if !strings.Contains(err.Error(), "\""+id+"\"") && id != "" {
			t.Errorf("error for %q does not quote it: %v", id, err)
		}
	}
}

func TestResolvers(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "cluster")
	os.WriteFile(good, []byte("  east-1\n"), 0o644)
	badFile := filepath.Join(dir, "bad")
	os.WriteFile(badFile, []byte("East_1\n"), 0o644)
	env := func(k string) (string, bool) {
		m := map[string]string{"GOOD": "west-2", "BAD": "WEST"}
		v, ok := m[k]
		return v, ok
	}
	host := func(name string) *Hostname {
		h, err := NewHostname(`^(?P<cluster>[a-z0-9-]+)-node-[0-9]+$`)
		if err != nil {
			t.Fatal(err)
		}
		h.Hostname = func() (string, error) { return name, nil }
		return h
	}
	tests := []struct {
		r       Resolver
		want    string
		errPart string // the error must contain it
	}{
		{Static("a"), "a", ""},
		{Static("Bad_ID!"), "", "static:Bad_ID!"},
		{Env{Var: "GOOD", Lookup: env}, "west-2", ""},
		{Env{Var: "BAD", Lookup: env}, "", "env:BAD"},
		{Env{Var: "MISSING", Lookup: env}, "", "MISSING is not set"},
		{File{Path: good}, "east-1", ""},
		{File{Path: badFile}, "", "East_1"},
		{File{Path: filepath.Join(dir, "none")}, "", "file:"},
		{host("eu-central-node-3"), "eu-central", ""},
		{host("laptop"), "", `"laptop" does not match`},
		{host("EU-node-1"), "", "does not match"},
	}
	for _, tc := range tests {
		got, err := Resolve(context.Background(), tc.r)
		if tc.errPart == "" {
			if err != nil || got != tc.want {
				t.Errorf("%s: got %q, %v; want %q", tc.r, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.errPart) {
			t.Errorf("%s: got %q, %v; want an error containing %q", tc.r, got, err, tc.errPart)
		}
	}
}

func TestParseSpec(t *testing.T) {
	for spec, want := range map[string]string{
		"static:a":                 "static:a",
		"env:REPL_CLUSTER":         "env:REPL_CLUSTER",
		"file:/etc/cluster":        "file:/etc/cluster",
		"hostname:^(?P<cluster>a)": "hostname:^(?P<cluster>a)",
	} {
		r, err := ParseSpec(spec)
		if err != nil || r.String() != want {
			t.Errorf("ParseSpec(%q) = %v, %v", spec, r, err)
		}
	}
	for _, spec := range []string{"", "static", "static:", "dns:x", "hostname:^(a)$", "hostname:("} {
		if _, err := ParseSpec(spec); err == nil {
			t.Errorf("ParseSpec(%q) accepted", spec)
		}
	}
}

func TestPin(t *testing.T) {
	dir := t.TempDir()
	if _, err := Pin(dir, "east-1", false); err != nil {
		t.Fatalf("first pin: %v", err)
	}
	if _, err := Pin(dir, "east-1", false); err != nil {
		t.Fatalf("same id again: %v", err)
	}
	_, err := Pin(dir, "west-2", false)
	var me *MismatchError
	if !errors.Is(err, ErrMismatch) || !errors.As(err, &me) {
		t.Fatalf("other id: got %v, want MismatchError", err)
	}
	if !strings.Contains(err.Error(), "east-1") || !strings.Contains(err.Error(), "west-2") {
		t.Fatalf("mismatch error does not name both ids: %v", err)
	}
	prev, err := Pin(dir, "west-2", true)
	if err != nil || prev != "east-1" {
		t.Fatalf("reassign: prev %q, %v", prev, err)
	}
	if _, err := Pin(dir, "west-2", false); err != nil {
		t.Fatalf("after reassign the new id is pinned: %v", err)
	}
}
