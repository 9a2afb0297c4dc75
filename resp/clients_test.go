package resp

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"
)

// readBulk reads one bulk string reply.
func readBulk(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	head, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		t.Fatalf("got %q %v, want a bulk string", head, err)
	}
	var n int
	fmt.Sscanf(head, "$%d", &n)
	b := make([]byte, n+2)
	if _, err := io.ReadFull(br, b); err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
}

// TestClientListAndKill: CLIENT LIST shows every connection with its ID,
// address, name, last command and open transaction; CLIENT KILL ID closes
// the one named (its socket reads EOF), the old form by address answers
// OK or "No such client", and SKIPME keeps the caller unless told no.
func TestClientListAndKill(t *testing.T) {
	_, addr := serve(t, &recordingNode{}, Options{})
	a, abr := dial(t, addr)
	b, bbr := dial(t, addr)
	fmt.Fprint(a, "CLIENT SETNAME alpha\r\nCLIENT ID\r\nMULTI\r\nPING\r\n")
	expect(t, abr, "+OK")
	idLine, _ := abr.ReadString('\n')
	expect(t, abr, "+OK")
	expect(t, abr, "+QUEUED")
	var aID int64
	fmt.Sscanf(idLine, ":%d", &aID)

	fmt.Fprint(b, "CLIENT LIST\r\n")
	list := readBulk(t, bbr)
	lines := strings.Split(strings.TrimSpace(list), "\n")
	if len(lines) != 2 {
		t.Fatalf("CLIENT LIST shows %d connections, want 2:\n%s", len(lines), list)
	}
	want := regexp.MustCompile(fmt.Sprintf(`^id=%d addr=%s laddr=\S+ fd=-1 name=alpha age=\d+ idle=\d+ flags=N db=0 sub=0 psub=0 ssub=0 multi=1 cmd=ping user=default resp=2$`,
		aID, regexp.QuoteMeta(a.LocalAddr().String())))
	// The list is in the order of the connections' IDs, and the server
	// may have numbered b's connection first (its accepts run apart from
	// the dials: a CI run did).
	aLine, bLine := lines[0], lines[1]
	if !strings.HasPrefix(aLine, fmt.Sprintf("id=%d ", aID)) {
		aLine, bLine = bLine, aLine
	}
	if !want.MatchString(aLine) {
		t.Fatalf("a's line %q does not match %s", aLine, want)
	}
	if !strings.Contains(bLine, "cmd=client") {
		t.Fatalf("b's line %q", bLine)
	}
	fmt.Fprintf(b, "CLIENT LIST ID %d\r\n", aID)
	if got := readBulk(t, bbr); strings.Count(got, "\n") != 1 || !strings.Contains(got, "name=alpha") {
		t.Fatalf("CLIENT LIST ID: %q", got)
	}

	fmt.Fprintf(b, "CLIENT KILL ID %d\r\nCLIENT KILL ID 999999\r\nCLIENT KILL 10.0.0.1:1\r\n", aID)
	expect(t, bbr, ":1")
	expect(t, bbr, ":0")
	expect(t, bbr, "-ERR No such client")
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := abr.ReadString('\n'); err == nil {
		t.Fatalf("the killed connection read %q", line)
	}
	// SKIPME yes by default: the caller is not killed by its own address;
	// the old form kills it, after its reply.
	fmt.Fprintf(b, "CLIENT KILL ADDR %s\r\nCLIENT KILL %s\r\n", b.LocalAddr(), b.LocalAddr())
	expect(t, bbr, ":0")
	expect(t, bbr, "+OK")
	if line, err := bbr.ReadString('\n'); err == nil {
		t.Fatalf("a connection that killed itself read %q", line)
	}
}

// TestCommandInfoAndDocs: COMMAND INFO answers an entry per command named
// (nil for one not served), COMMAND DOCS a map of the known ones.
func TestCommandInfoAndDocs(t *testing.T) {
	_, addr := serve(t, &recordingNode{}, Options{})
	nc, br := dial(t, addr)
	fmt.Fprint(nc, "COMMAND INFO get nosuch\r\nCOMMAND DOCS mset nosuch\r\n")
	for _, want := range []string{"*2", "*6", "$3", "get", ":2", "*0", ":1", ":1", ":1", "$-1",
		"*2", "$4", "mset", "*4", "$7", "summary"} {
		expect(t, br, want)
	}
}
