package k8s

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/poplimit/poplimit/deploy/internal/deploytest"
)

// upstreamEnv is the env of envoyproxy/ratelimit's container in Istio's
// samples/ratelimit/rate-limit-service.yaml, as written there.
var upstreamEnv = []corev1.EnvVar{
	{Name: "LOG_LEVEL", Value: "debug"},
	{Name: "REDIS_SOCKET_TYPE", Value: "tcp"},
	{Name: "REDIS_URL", Value: "redis:6379"},
	{Name: "USE_STATSD", Value: "false"},
	{Name: "RUNTIME_ROOT", Value: "/data"},
	{Name: "RUNTIME_SUBDIRECTORY", Value: "ratelimit"},
	{Name: "RUNTIME_WATCH_ROOT", Value: "false"},
	{Name: "RUNTIME_IGNOREDOTFILES", Value: "true"},
	{Name: "HOST", Value: "::"},
	{Name: "GRPC_HOST", Value: "::"},
}

func decodeFile(t *testing.T, path string) *objects {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	o := &objects{}
	if err := decodeDocs(b, path, o); err != nil {
		t.Fatal(err)
	}
	return o
}

// ratelimit/rate-limit-service.yaml is Istio's Deployment of
// envoyproxy/ratelimit (testdata/istio-rate-limit-service.yaml, the
// upstream file) with the ratelimit container's image and command swapped
// and nothing else: its env is exactly the upstream one, and the command
// is the image's edge with -envoy-env, a flag the edge has.
func TestRatelimitDeploymentSwapsOnlyTheImage(t *testing.T) {
	ours := decodeFile(t, filepath.Join("ratelimit", "rate-limit-service.yaml"))
	upstream := decodeFile(t, filepath.Join("testdata", "istio-rate-limit-service.yaml"))
	container := func(o *objects) *corev1.Container {
		t.Helper()
		for _, d := range o.deployments {
			if d.Name == "ratelimit" {
				return &d.Spec.Template.Spec.Containers[0]
			}
		}
		t.Fatal("no Deployment ratelimit")
		return nil
	}
	c, up := container(ours), container(upstream)
	if !reflect.DeepEqual(c.Env, upstreamEnv) || !reflect.DeepEqual(up.Env, upstreamEnv) {
		t.Errorf("env:\n ours     %v\n upstream %v\nwant both %v", c.Env, up.Env, upstreamEnv)
	}
	if len(c.Command) != 2 || c.Command[0] != "/usr/local/bin/poplimit-edge" || c.Command[1] != "-envoy-env" || len(c.Args) != 0 {
		t.Errorf("command %q args %q, want [/usr/local/bin/poplimit-edge -envoy-env] and no args", c.Command, c.Args)
	}
	if strings.Contains(c.Image, "envoyproxy/ratelimit") {
		t.Errorf("image %s: still envoyproxy/ratelimit's", c.Image)
	}
	df, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(df), "/out/poplimit-edge") || !strings.Contains(string(df), " /usr/local/bin/") {
		t.Errorf("deploy/Dockerfile does not install %s", c.Command[0])
	}
	flags, err := deploytest.Flags(filepath.Join("..", "..", "cmd", "edge"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := flags["envoy-env"]; !ok {
		t.Error("cmd/edge has no -envoy-env")
	}
	// Swap them back: the rest is the upstream file, object for object.
	c.Image, c.Command = up.Image, up.Command
	if !reflect.DeepEqual(ours, upstream) {
		t.Errorf("ratelimit/rate-limit-service.yaml differs from Istio's beyond the image and command")
	}
}
