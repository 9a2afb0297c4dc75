package transport

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestUnreachedSaysWhatFailed (issue 49, 5): a link's last error for a peer
// that is down used to talk about proving the secret. Each way a request
// can get no answer, made with real sockets, reads as what it is.
func TestUnreachedSaysWhatFailed(t *testing.T) {
	ask := func(c *http.Client, url string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, http.NoBody)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s answered", url)
		}
		return unreached("b", url, err)
	}
	// A port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	// A TLS peer whose certificate this client does not trust.
	tlsSrv := httptest.NewUnstartedServer(http.NotFoundHandler())
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	// A plain-HTTP peer given as https://.
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	// A peer that accepts and never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		// Exits when the listener closes (the test's defer).
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for _, tc := range []struct {
		name, url, want string
		client          *http.Client
	}{
		{"refused", closed, "refused the connection", http.DefaultClient},
		{"untrusted certificate", tlsSrv.URL, "certificate does not verify", http.DefaultClient},
		{"not TLS", strings.Replace(plain.URL, "http://", "https://", 1), "does not speak TLS", http.DefaultClient},
		{"silent", "http://" + silent.Addr().String(), "did not answer in time", &http.Client{Timeout: 200 * time.Millisecond}},
	} {
		err := ask(tc.client, tc.url)
		if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: %v, want it to say %q", tc.name, err, tc.want)
		}
		if errors.Unwrap(err) == nil {
			t.Errorf("%s: the cause is not kept: %v", tc.name, err)
		}
	}
}
