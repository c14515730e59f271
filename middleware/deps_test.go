package middleware_test

import (
	"os/exec"
	"strings"
	"testing"
)

// heavyDeps are the clients of the edge's transports, stores and front
// ends: a program embedding the limiter in net/http needs none of them.
var heavyDeps = []string{
	"google.golang.org/grpc",
	"github.com/envoyproxy/go-control-plane",
	"github.com/segmentio/kafka-go",
	"github.com/twmb/franz-go",
	"github.com/redis/rueidis",
	"github.com/bradfitz/gomemcache",
	"github.com/valyala/fasthttp",
}

// The net/http middleware, the core it takes and the embedding entry point
// (package poplimit) import no transport, store client or other front end.
func TestImportsNoHeavyDeps(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, pkg := range []string{"github.com/poplimit/poplimit", "github.com/poplimit/poplimit/middleware", "github.com/poplimit/poplimit/decision"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		for _, d := range deps {
			for _, h := range heavyDeps {
				if d == h || strings.HasPrefix(d, h+"/") {
					t.Errorf("%s imports %s", pkg, d)
				}
			}
		}
		t.Logf("%s: %d packages", pkg, len(deps))
	}
}
