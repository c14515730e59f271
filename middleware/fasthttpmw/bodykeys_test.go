package fasthttpmw_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/middleware"
	"github.com/poplimit/poplimit/middleware/fasthttpmw"
)

// Behind the fasthttp wrapper, on a real fasthttp server that streams
// request bodies and on one that reads them whole, a login rule keyed by
// a JSON member holds each account's attempts, and the handler reads the
// whole body as the client sent it (a body over the bound included).
func TestBodyKeys(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			core := newCore(t, `
rules:
  - {name: login, path_prefix: /login, methods: [POST], key: ["json:/email"], key_case: insensitive, limit: 2, window: 15m}
  - {name: rest, limit: 1000, window: 1m}
`)
			wrap, err := fasthttpmw.New(core, middleware.Config{})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var got string
			srv := &fasthttp.Server{StreamRequestBody: stream, MaxRequestBodySize: 4 << 20, Handler: wrap(func(ctx *fasthttp.RequestCtx) {
				b := ctx.Request.Body()
				mu.Lock()
				got = fmt.Sprintf("%d %x", len(b), sha256.Sum256(b))
				mu.Unlock()
				ctx.SetStatusCode(401)
			})}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Shutdown() })
			hc := &http.Client{Timeout: 30 * time.Second}
			defer hc.CloseIdleConnections()
			send := func(body []byte, chunked bool) int {
				t.Helper()
				var r io.Reader = bytes.NewReader(body)
				if chunked {
					r = io.MultiReader(r)
				}
				req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/login", r)
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				if want := fmt.Sprintf("%d %x", len(body), sha256.Sum256(body)); resp.StatusCode == 401 && got != want {
					t.Fatalf("the handler read %s, the client sent %s", got, want)
				}
				return resp.StatusCode
			}
			for i, u := range []string{"Oscar@x.io", "OSCAR@X.IO"} {
				if st := send([]byte(`{"email":"`+u+`"}`), i == 1); st != 401 {
					t.Fatalf("attempt %d: %d", i, st)
				}
			}
			if st := send([]byte(`{"email":"oscar@x.io"}`), false); st != 429 {
				t.Errorf("oscar's third attempt: %d, want 429", st)
			}
			if st := send([]byte(`{"email":"peggy@x.io"}`), true); st != 401 {
				t.Errorf("peggy, from the same client: %d, want 401", st)
			}
			big := []byte(`{"email":"trent@x.io","pad":"` + strings.Repeat("x", 100<<10) + `"}`)
			for _, chunked := range []bool{false, true} {
				if st := send(big, chunked); st != 401 {
					t.Errorf("a 100 KiB body (chunked %v): %d", chunked, st)
				}
			}
		})
	}
}
