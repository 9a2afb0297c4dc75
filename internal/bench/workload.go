package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func key(prefix string, i int) string { return fmt.Sprintf("%s/%012d", prefix, i) }

// appendKey appends key(prefix, i) as a JSON string.
func appendKey(b []byte, prefix string, i int64) []byte {
	q := strconv.AppendQuote(b, prefix)
	q = q[:len(q)-1] // reopen the string
	q = append(q, '/')
	var d [20]byte
	ds := strconv.AppendInt(d[:0], i, 10)
	for range 12 - len(ds) {
		q = append(q, '0')
	}
	q = append(q, ds...)
	return append(q, '"')
}

// write issues n writes at c with keys prefix/<i> (i from first), in the
// configured mode and concurrency.
func write(ctx context.Context, cfg *Config, c *cluster, prefix string, first, n int) error {
	// The driver shares the machine with the nodes: its bodies are built
	// with appends (the values quoted once), not fmt, which was a third of
	// its CPU and the CPU a saturated three-node run lacks.
	values, qvalues := valuePool(cfg)
	var next atomic.Int64
	next.Store(int64(first))
	end := int64(first + n)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	chunk := int64(cfg.BatchOps)
	if cfg.Mode == "bulk" {
		chunk = int64(max(5000, n/cfg.Concurrency/4))
	}
	if cfg.Mode == "put" {
		chunk = 1
	}
	for w := 0; w < cfg.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf bytes.Buffer
			for ctx.Err() == nil {
				lo := next.Add(chunk) - chunk
				if lo >= end {
					return
				}
				hi := min(lo+chunk, end)
				buf.Reset()
				var err error
				switch cfg.Mode {
				case "put":
					var req *http.Request
					req, err = http.NewRequestWithContext(ctx, http.MethodPut, c.url+"/v1/kv/"+key(prefix, int(lo)), strings.NewReader(values[lo%int64(len(values))]))
					if err == nil {
						var resp *http.Response
						if resp, err = hc.Do(req); err == nil {
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if resp.StatusCode != 200 {
								err = fmt.Errorf("put: %d", resp.StatusCode)
							}
						}
					}
				case "batch":
					b := append(buf.AvailableBuffer(), `{"ops":[`...)
					for i := lo; i < hi; i++ {
						if i > lo {
							b = append(b, ',')
						}
						b = append(b, `{"op":"set","key":`...)
						b = appendKey(b, prefix, i)
						b = append(b, `,"value":`...)
						b = append(b, qvalues[i%int64(len(qvalues))]...)
						b = append(b, '}')
					}
					b = append(b, `]}`...)
					buf.Write(b)
					err = c.post("/v1/batch", buf.Bytes())
				default:
					b := buf.AvailableBuffer()
					for i := lo; i < hi; i++ {
						b = append(b, `{"key":`...)
						b = appendKey(b, prefix, i)
						b = append(b, `,"value":`...)
						b = append(b, qvalues[i%int64(len(qvalues))]...)
						b = append(b, "}\n"...)
					}
					buf.Write(b)
					err = c.post("/v1/bulk", buf.Bytes())
				}
				if err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// closedLoop runs cfg.PutClients clients that each PUT one key after
// another at c for cfg.SteadyFor.
func closedLoop(ctx context.Context, c *cluster, cfg *Config, prefix string) (acked, failed *atomic.Int64) {
	acked, failed = new(atomic.Int64), new(atomic.Int64)
	deadline := time.Now().Add(cfg.SteadyFor)
	var wg sync.WaitGroup
	value := strings.Repeat("v", cfg.ValueSize)
	for w := 0; w < cfg.PutClients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil && time.Now().Before(deadline); i++ {
				if c.put(key(fmt.Sprint(prefix, "-", w), i), value) == nil {
					acked.Add(1)
				} else {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return acked, failed
}

// valuePool is the values writes cycle through, and each quoted as JSON.
// The json mix is 16,384 documents (about 5 MB: more than a batch, so a
// link's compression sees no repeats of a whole document within one) of a
// few hundred bytes, with the field names of an order and varying values.
func valuePool(cfg *Config) (values, quoted []string) {
	if cfg.Values != "json" {
		v := strings.Repeat("v", cfg.ValueSize)
		return []string{v}, []string{strconv.Quote(v)}
	}
	const n = 16384
	values, quoted = make([]string, n), make([]string, n)
	x := uint64(0x9e3779b97f4a7c15)
	rnd := func(m int) int { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return int(x % uint64(m)) }
	states := []string{"new", "paid", "packed", "shipped", "delivered", "returned"}
	countries := []string{"DE", "FR", "US", "JP", "BR", "IN", "GB", "ES"}
	names := []string{"Ada", "Grace", "Linus", "Barbara", "Ken", "Edsger", "Frances", "Dennis", "Margaret", "Donald"}
	for i := range n {
		var b strings.Builder
		fmt.Fprintf(&b, `{"tenant":"t%03d","kind":"order","id":%d,"state":%q,"customer":{"name":%q,"country":%q,"since":"20%02d-%02d-%02d"},"lines":[`,
			rnd(200), 100000+i*7+rnd(7), states[rnd(len(states))], names[rnd(len(names))]+fmt.Sprintf(" %c.", 'A'+rnd(26)), countries[rnd(len(countries))],
			10+rnd(15), 1+rnd(12), 1+rnd(28))
		for l := range 1 + rnd(4) {
			if l > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"sku":"%c%c-%04d","qty":%d,"price":%d.%02d}`, 'A'+rnd(26), 'A'+rnd(26), rnd(10000), 1+rnd(9), rnd(500), rnd(100))
		}
		fmt.Fprintf(&b, `],"note":"%x","updated":%d}`, x, 1700000000+rnd(30000000))
		values[i] = b.String()
		quoted[i] = strconv.Quote(values[i])
	}
	return values, quoted
}
