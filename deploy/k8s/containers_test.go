package k8s

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/poplimit/poplimit/deploy/internal/deploytest"
	"github.com/poplimit/poplimit/rules"
)

// binary describes one of the poplimit commands: its flags, the paths its
// HTTP listener serves, and the flags that name listeners.
type binary struct {
	flags     map[string]deploytest.Flag
	paths     []string // served on the admin (edge) or the only (aggregator) listener
	listeners []string // flags whose value is host:port
	admin     string   // the listener flag of /metrics and the probes
}

func binaries(t *testing.T) map[string]binary {
	t.Helper()
	bins := map[string]binary{}
	for name, b := range map[string]binary{
		"poplimit-edge":       {listeners: []string{"listen", "admin"}, admin: "admin"},
		"poplimit-aggregator": {listeners: []string{"listen"}, admin: "listen"},
	} {
		dir := filepath.Join("..", "..", "cmd", strings.TrimPrefix(name, "poplimit-"))
		fs, err := deploytest.Flags(dir)
		if err != nil {
			t.Fatal(err)
		}
		b.flags = fs
		// The HTTP paths are string literals in the handlers' sources.
		srcDirs := []string{dir}
		switch name {
		case "poplimit-edge":
			srcDirs = append(srcDirs, filepath.Join("..", "..", "edge"))
		case "poplimit-aggregator":
			srcDirs = append(srcDirs, filepath.Join("..", "..", "aggregator"))
		}
		for _, d := range srcDirs {
			files, _ := filepath.Glob(filepath.Join(d, "*.go"))
			for _, f := range files {
				if strings.HasSuffix(f, "_test.go") {
					continue
				}
				src, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range regexp.MustCompile(`"(?:GET )?(/(?:metrics|healthz|readyz|report))"`).FindAllStringSubmatch(string(src), -1) {
					b.paths = append(b.paths, m[1])
				}
			}
		}
		bins[name] = b
	}
	return bins
}

// args parses a container's args as Go's flag package would: -name=value,
// -name value, or a lone boolean -name.
func args(t *testing.T, c corev1.Container, flags map[string]deploytest.Flag) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := 0; i < len(c.Args); i++ {
		a := c.Args[i]
		if !strings.HasPrefix(a, "-") {
			t.Errorf("container %s: argument %q is not a flag", c.Name, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if _, ok := flags[name]; !ok {
			t.Errorf("container %s: %s: %s defines no -%s", c.Name, a, c.Command[0], name)
			continue
		}
		if !hasValue && i+1 < len(c.Args) && !strings.HasPrefix(c.Args[i+1], "-") {
			i++
			value = c.Args[i]
		}
		out[name] = value
	}
	return out
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// resolve replaces $(VAR) in s with the container's env values, looking
// configMapKeyRef values up in the ConfigMaps; it fails the test for a
// variable or a key that does not exist.
func resolve(t *testing.T, c corev1.Container, o *objects, s string) string {
	t.Helper()
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		name := varRef.FindStringSubmatch(m)[1]
		for _, e := range c.Env {
			if e.Name != name {
				continue
			}
			if e.ValueFrom == nil {
				return e.Value
			}
			if ref := e.ValueFrom.ConfigMapKeyRef; ref != nil {
				return configValue(t, o, ref.Name, ref.Key)
			}
			t.Errorf("container %s: $(%s) comes from neither a value nor a ConfigMap key", c.Name, name)
			return ""
		}
		t.Errorf("container %s: $(%s) is not in its env", c.Name, name)
		return ""
	})
}

func configValue(t *testing.T, o *objects, name, key string) string {
	t.Helper()
	for _, cm := range o.configMaps {
		if cm.Name == name {
			v, ok := cm.Data[key]
			if !ok {
				t.Errorf("ConfigMap %s has no key %s", name, key)
			}
			return v
		}
	}
	t.Errorf("no ConfigMap %s", name)
	return ""
}

func portOfAddr(t *testing.T, addr string) int32 {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	p, err := strconv.Atoi(addr[i+1:])
	if i < 0 || err != nil {
		t.Errorf("address %q has no port", addr)
	}
	return int32(p)
}

// TestContainersAgreeWithBinaries checks the poplimit containers against
// their commands: flags exist, listeners are the container ports, probes
// probe the admin listener on paths it serves, $(VAR)s and ConfigMap keys
// exist, the rules file is a mounted ConfigMap that rules.ParseRules
// accepts, the memcache list names the StatefulSet's pods, and the edges
// and the aggregator agree on the topic.
func TestContainersAgreeWithBinaries(t *testing.T) {
	k, o := load(t)
	bins := binaries(t)
	topics := map[string]string{}
	seen := map[string]bool{}
	for _, w := range workloads(o) {
		spec := w.template.Spec
		for _, c := range spec.Containers {
			for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
				if p == nil {
					t.Errorf("%s %s: container %s: want readiness and liveness probes", w.kind, w.name, c.Name)
					continue
				}
				port := intstr.IntOrString{}
				switch {
				case p.HTTPGet != nil:
					port = p.HTTPGet.Port
				case p.TCPSocket != nil:
					port = p.TCPSocket.Port
				default:
					t.Errorf("%s %s: container %s: a probe that is neither httpGet nor tcpSocket", w.kind, w.name, c.Name)
				}
				if _, ok := portOf(corev1.PodSpec{Containers: []corev1.Container{c}}, port); !ok {
					t.Errorf("%s %s: container %s: probe port %s is not a container port", w.kind, w.name, c.Name, port.String())
				}
			}
			if c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
				t.Errorf("%s %s: container %s: want memory and CPU requests and a memory limit", w.kind, w.name, c.Name)
			}
			if len(c.Command) == 0 {
				continue
			}
			exe := filepath.Base(c.Command[0])
			b, ok := bins[exe]
			if !ok {
				t.Errorf("%s %s: container %s runs %s, which is not a poplimit command", w.kind, w.name, c.Name, c.Command[0])
				continue
			}
			seen[exe] = true
			if c.Image != "poplimit" || !slices.ContainsFunc(k.Images, func(i struct {
				Name    string `json:"name"`
				NewName string `json:"newName,omitempty"`
				NewTag  string `json:"newTag,omitempty"`
			}) bool {
				return i.Name == c.Image
			}) {
				t.Errorf("%s %s: image %q: want \"poplimit\", set by kustomization.yaml's images", w.kind, w.name, c.Image)
			}
			fl := args(t, c, b.flags)

			// Listeners are the container ports, and only they are.
			var listened []int32
			for _, l := range b.listeners {
				addr, ok := fl[l]
				if !ok {
					t.Errorf("%s %s: -%s not set: the default listens on loopback only", w.kind, w.name, l)
					continue
				}
				listened = append(listened, portOfAddr(t, addr))
			}
			for _, cp := range c.Ports {
				if !slices.Contains(listened, cp.ContainerPort) {
					t.Errorf("%s %s: container port %s %d: no listener flag names it (%v)", w.kind, w.name, cp.Name, cp.ContainerPort, listened)
				}
			}
			adminPort := portOfAddr(t, fl[b.admin])
			for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
				if p == nil || p.HTTPGet == nil {
					t.Errorf("%s %s: want httpGet probes on the admin listener", w.kind, w.name)
					continue
				}
				if cp, _ := portOf(corev1.PodSpec{Containers: []corev1.Container{c}}, p.HTTPGet.Port); cp.ContainerPort != adminPort {
					t.Errorf("%s %s: probe %s on port %d, want the -%s listener's %d", w.kind, w.name, p.HTTPGet.Path, cp.ContainerPort, b.admin, adminPort)
				}
				if !slices.Contains(b.paths, p.HTTPGet.Path) {
					t.Errorf("%s %s: probe path %s: %s serves %v", w.kind, w.name, p.HTTPGet.Path, exe, b.paths)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
					configValue(t, o, e.ValueFrom.ConfigMapKeyRef.Name, e.ValueFrom.ConfigMapKeyRef.Key)
				}
				if e.Name == "GOMEMLIMIT" {
					checkMemLimit(t, w.name, e.Value, c.Resources.Limits.Memory())
				}
			}
			for name, v := range fl {
				fl[name] = resolve(t, c, o, v)
			}
			if topic, ok := fl["topic"]; ok {
				topics[exe] = topic
			}
			if rules, ok := fl["rules"]; ok {
				checkRulesMount(t, w, c, o, rules)
			}
			if mc, ok := fl["memcache"]; ok {
				checkMemcacheList(t, w, o, mc)
			}
		}
	}
	for exe := range bins {
		if !seen[exe] {
			t.Errorf("no container runs %s", exe)
		}
	}
	if topics["poplimit-edge"] == "" || topics["poplimit-edge"] != topics["poplimit-aggregator"] {
		t.Errorf("topics: edges write %q, the aggregator reads %q", topics["poplimit-edge"], topics["poplimit-aggregator"])
	}
}

// checkMemLimit checks that GOMEMLIMIT leaves the Go runtime room under the
// container's memory limit.
func checkMemLimit(t *testing.T, workload, value string, limit *resource.Quantity) {
	t.Helper()
	q, err := resource.ParseQuantity(strings.TrimSuffix(value, "B"))
	if err != nil {
		t.Errorf("%s: GOMEMLIMIT %q: %v", workload, value, err)
		return
	}
	if limit.IsZero() || q.Cmp(*limit) >= 0 || float64(q.Value()) < 0.7*float64(limit.Value()) {
		t.Errorf("%s: GOMEMLIMIT %s against a memory limit of %s: want 70 to 100 %% of it", workload, value, limit.String())
	}
}

// checkRulesMount checks that the -rules file is a key of a ConfigMap
// mounted whole (so that updates reach the edge) and that it parses.
func checkRulesMount(t *testing.T, w workload, c corev1.Container, o *objects, path string) {
	t.Helper()
	dir, key := filepath.Dir(path), filepath.Base(path)
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		if m.SubPath != "" {
			t.Errorf("%s: -rules is mounted with subPath: ConfigMap updates would never reach the edge", w.name)
		}
		for _, v := range w.template.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.ConfigMap == nil {
				t.Fatalf("%s: volume %s of -rules is not a ConfigMap", w.name, v.Name)
			}
			data := configValue(t, o, v.ConfigMap.Name, key)
			rs, err := rules.ParseRules([]byte(data))
			if err != nil {
				t.Errorf("%s: ConfigMap %s key %s: rules.ParseRules: %v", w.name, v.ConfigMap.Name, key, err)
			} else if len(rs.Rules) == 0 {
				t.Errorf("%s: ConfigMap %s key %s: no rules", w.name, v.ConfigMap.Name, key)
			}
			return
		}
	}
	t.Errorf("%s: -rules %s: no volume is mounted at %s", w.name, path, dir)
}

// checkMemcacheList checks that -memcache lists every pod of the memcached
// StatefulSet by its stable name, in ordinal order, on its port, so that
// every edge builds the same ring.
func checkMemcacheList(t *testing.T, w workload, o *objects, list string) {
	t.Helper()
	if len(o.statefulSets) != 1 {
		t.Fatalf("want one memcached StatefulSet, have %d", len(o.statefulSets))
	}
	s := o.statefulSets[0]
	spec := s.Spec.Template.Spec
	if len(spec.Containers) != 1 || len(spec.Containers[0].Ports) != 1 {
		t.Fatalf("StatefulSet %s: want one container with one port", s.Name)
	}
	mc := spec.Containers[0]
	port := mc.Ports[0].ContainerPort
	// memcached's own -p agrees with the container port.
	if i := slices.Index(mc.Args, "-p"); i < 0 || i+1 >= len(mc.Args) || mc.Args[i+1] != strconv.Itoa(int(port)) {
		t.Errorf("StatefulSet %s: memcached args %q: want -p %d", s.Name, mc.Args, port)
	}
	var want []string
	for i := range ptrOr(s.Spec.Replicas, 1) {
		want = append(want, fmt.Sprintf("%s-%d.%s:%d", s.Name, i, s.Spec.ServiceName, port))
	}
	if got := strings.Split(list, ","); !slices.Equal(got, want) {
		t.Errorf("%s: -memcache %q, want the StatefulSet's %d pods in order: %q", w.name, got, len(want), want)
	}
}

// TestDockerfileBuildsTheCommands checks that the image the manifests run
// puts the binaries where their command lines say.
func TestDockerfileBuildsTheCommands(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	_, o := load(t)
	for _, w := range workloads(o) {
		for _, c := range w.template.Spec.Containers {
			if len(c.Command) == 0 {
				continue
			}
			exe := filepath.Base(c.Command[0])
			if !strings.Contains(df, "-o /out/"+exe+" ./cmd/"+strings.TrimPrefix(exe, "poplimit-")) || !strings.Contains(df, "/usr/local/bin/") ||
				filepath.Dir(c.Command[0]) != "/usr/local/bin" {
				t.Errorf("%s runs %s: deploy/Dockerfile does not build it into /usr/local/bin", w.name, c.Command[0])
			}
		}
	}
}
