// Package k8s is the kustomize base of deploy/k8s; it holds no code, only
// the test that decodes every manifest into the Kubernetes API types,
// strictly, and checks it against the binaries: flags, ports, probes,
// labels and selectors, config keys, and the PrometheusRule against
// deploy/prometheus/rules.
package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/rules"

	"github.com/poplimit/poplimit/deploy/internal/deploytest"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite prometheusrule.yaml from deploy/prometheus/rules")

const (
	rulesDir           = "../prometheus/rules"
	prometheusRuleFile = "prometheusrule.yaml"
)

// kustomization is the part of kustomization.yaml this base uses, decoded
// strictly: a field kustomize has and this struct lacks is an error, so
// that nothing in the file goes unchecked.
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
		IncludeTemplates bool              `json:"includeTemplates,omitempty"`
	} `json:"labels,omitempty"`
	Resources          []string `json:"resources"`
	ConfigMapGenerator []struct {
		Name     string   `json:"name"`
		Files    []string `json:"files,omitempty"`
		Literals []string `json:"literals,omitempty"`
		Options  *struct {
			DisableNameSuffixHash bool `json:"disableNameSuffixHash,omitempty"`
		} `json:"options,omitempty"`
	} `json:"configMapGenerator,omitempty"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images,omitempty"`
}

// objects are the base's objects by kind, the generated ConfigMaps included.
type objects struct {
	deployments     []*appsv1.Deployment
	statefulSets    []*appsv1.StatefulSet
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	pdbs            []*policyv1.PodDisruptionBudget
	podMonitors     []*monitoringv1.PodMonitor
	serviceMonitors []*monitoringv1.ServiceMonitor
	prometheusRules []*monitoringv1.PrometheusRule
	// generatedFiles are the files configMapGenerator reads.
	generatedFiles []string
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeDocs decodes every document of a multi-document YAML stream
// strictly into the typed object of its apiVersion and kind.
func decodeDocs(data []byte, where string, o *objects) error {
	for i, doc := range docSeparator.Split(string(data), -1) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return fmt.Errorf("%s: document %d: %w", where, i, err)
		}
		if meta.Kind == "" && meta.APIVersion == "" {
			if strings.TrimSpace(stripComments(doc)) != "" {
				return fmt.Errorf("%s: document %d has no apiVersion and kind", where, i)
			}
			continue
		}
		var obj any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			d := &appsv1.Deployment{}
			o.deployments, obj = append(o.deployments, d), d
		case "apps/v1 StatefulSet":
			s := &appsv1.StatefulSet{}
			o.statefulSets, obj = append(o.statefulSets, s), s
		case "v1 Service":
			s := &corev1.Service{}
			o.services, obj = append(o.services, s), s
		case "v1 ConfigMap":
			c := &corev1.ConfigMap{}
			o.configMaps, obj = append(o.configMaps, c), c
		case "autoscaling/v2 HorizontalPodAutoscaler":
			h := &autoscalingv2.HorizontalPodAutoscaler{}
			o.hpas, obj = append(o.hpas, h), h
		case "policy/v1 PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			o.pdbs, obj = append(o.pdbs, p), p
		case "monitoring.coreos.com/v1 PodMonitor":
			p := &monitoringv1.PodMonitor{}
			o.podMonitors, obj = append(o.podMonitors, p), p
		case "monitoring.coreos.com/v1 ServiceMonitor":
			s := &monitoringv1.ServiceMonitor{}
			o.serviceMonitors, obj = append(o.serviceMonitors, s), s
		case "monitoring.coreos.com/v1 PrometheusRule":
			p := &monitoringv1.PrometheusRule{}
			o.prometheusRules, obj = append(o.prometheusRules, p), p
		default:
			return fmt.Errorf("%s: document %d: %s %s: the test knows no type for it", where, i, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return fmt.Errorf("%s: document %d (%s): %w", where, i, meta.Kind, err)
		}
		// encoding/json matches field names regardless of case, which the
		// API server does not: check the exact names too.
		var tree any
		if err := yaml.Unmarshal([]byte(doc), &tree); err != nil {
			return fmt.Errorf("%s: document %d: %w", where, i, err)
		}
		if err := exactFields(meta.Kind, tree, reflect.TypeOf(obj)); err != nil {
			return fmt.Errorf("%s: document %d: %w", where, i, err)
		}
	}
	return nil
}

var unmarshaler = reflect.TypeFor[json.Unmarshaler]()

// exactFields checks that every key of the decoded JSON tree v names a field
// of typ by its exact JSON name, recursively.
func exactFields(path string, v any, typ reflect.Type) error {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if reflect.PointerTo(typ).Implements(unmarshaler) || typ.Implements(unmarshaler) {
		return nil // decodes itself (Quantity, IntOrString, Time, ...)
	}
	switch typ.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil // a type mismatch, which UnmarshalStrict reports
		}
		fields := map[string]reflect.Type{}
		jsonFields(typ, fields)
		for key, sub := range obj {
			ft, ok := fields[key]
			if !ok {
				return fmt.Errorf("%s: unknown field %q (names are case-sensitive)", path, key)
			}
			if err := exactFields(path+"."+key, sub, ft); err != nil {
				return err
			}
		}
	case reflect.Map:
		if obj, ok := v.(map[string]any); ok {
			for key, sub := range obj {
				if err := exactFields(path+"."+key, sub, typ.Elem()); err != nil {
					return err
				}
			}
		}
	case reflect.Slice, reflect.Array:
		if list, ok := v.([]any); ok {
			for i, sub := range list {
				if err := exactFields(fmt.Sprintf("%s[%d]", path, i), sub, typ.Elem()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// jsonFields adds the JSON names of typ's fields to fields, flattening
// embedded and inline structs as encoding/json does.
func jsonFields(typ reflect.Type, fields map[string]reflect.Type) {
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if name == "" && (f.Anonymous || strings.Contains(opts, "inline")) && ft.Kind() == reflect.Struct {
			jsonFields(ft, fields)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func readKustomization(t *testing.T) kustomization {
	t.Helper()
	var k kustomization
	b, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	var tree any
	if err := yaml.Unmarshal(b, &tree); err != nil {
		t.Fatal(err)
	}
	if err := exactFields("kustomization.yaml", tree, reflect.TypeOf(k)); err != nil {
		t.Fatal(err)
	}
	return k
}

// load decodes the base's resources and builds its generated ConfigMaps
// (without hash suffixes).
func load(t *testing.T) (kustomization, *objects) {
	t.Helper()
	k := readKustomization(t)
	o := &objects{}
	for _, r := range k.Resources {
		b, err := os.ReadFile(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := decodeDocs(b, r, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range k.ConfigMapGenerator {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: g.Name}, Data: map[string]string{}}
		for _, f := range g.Files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			cm.Data[filepath.Base(f)] = string(b)
			o.generatedFiles = append(o.generatedFiles, f)
		}
		for _, l := range g.Literals {
			key, value, ok := strings.Cut(l, "=")
			if !ok {
				t.Fatalf("configMapGenerator %s: literal %q is not key=value", g.Name, l)
			}
			cm.Data[key] = value
		}
		o.configMaps = append(o.configMaps, cm)
	}
	return k, o
}

// TestManifestsDecodeStrictly checks that kustomization.yaml lists every
// manifest of the directory, and that every manifest decodes strictly into
// its API type with a name and the app.kubernetes.io/name label.
func TestManifestsDecodeStrictly(t *testing.T) {
	k, o := load(t)
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml: %s %s", k.APIVersion, k.Kind)
	}
	files, _ := filepath.Glob("*.yaml")
	var want []string
	for _, f := range files {
		if f != "kustomization.yaml" && !slices.Contains(o.generatedFiles, f) {
			want = append(want, f)
		}
	}
	got := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(got, want) {
		t.Errorf("kustomization.yaml resources: %q, want every manifest here: %q", got, want)
	}
	metas := []metav1.ObjectMeta{}
	for _, d := range o.deployments {
		metas = append(metas, d.ObjectMeta)
	}
	for _, s := range o.statefulSets {
		metas = append(metas, s.ObjectMeta)
	}
	for _, s := range o.services {
		metas = append(metas, s.ObjectMeta)
	}
	for _, h := range o.hpas {
		metas = append(metas, h.ObjectMeta)
	}
	for _, p := range o.pdbs {
		metas = append(metas, p.ObjectMeta)
	}
	for _, p := range o.podMonitors {
		metas = append(metas, p.ObjectMeta)
	}
	for _, s := range o.serviceMonitors {
		metas = append(metas, s.ObjectMeta)
	}
	for _, p := range o.prometheusRules {
		metas = append(metas, p.ObjectMeta)
	}
	for _, m := range metas {
		if m.Name == "" || m.Labels["app.kubernetes.io/name"] == "" {
			t.Errorf("object %q: want a name and an app.kubernetes.io/name label", m.Name)
		}
		if m.Namespace != "" {
			t.Errorf("object %s: namespace %s: a base leaves the namespace to the overlay", m.Name, m.Namespace)
		}
	}
	if len(o.deployments) != 2 || len(o.statefulSets) != 1 || len(o.hpas) != 1 || len(o.podMonitors) != 1 ||
		len(o.serviceMonitors) != 1 || len(o.prometheusRules) != 1 {
		t.Errorf("want 2 Deployments, 1 StatefulSet, HPA, PodMonitor, ServiceMonitor and PrometheusRule; got %d %d %d %d %d %d",
			len(o.deployments), len(o.statefulSets), len(o.hpas), len(o.podMonitors), len(o.serviceMonitors), len(o.prometheusRules))
	}
}

// workload is a Deployment or a StatefulSet: a name, a selector and a pod
// template.
type workload struct {
	kind, name string
	selector   *metav1.LabelSelector
	template   corev1.PodTemplateSpec
	replicas   int32
}

func workloads(o *objects) []workload {
	var ws []workload
	for _, d := range o.deployments {
		ws = append(ws, workload{"Deployment", d.Name, d.Spec.Selector, d.Spec.Template, ptrOr(d.Spec.Replicas, 1)})
	}
	for _, s := range o.statefulSets {
		ws = append(ws, workload{"StatefulSet", s.Name, s.Spec.Selector, s.Spec.Template, ptrOr(s.Spec.Replicas, 1)})
	}
	return ws
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func selects(t *testing.T, sel *metav1.LabelSelector, set map[string]string) bool {
	t.Helper()
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	return !s.Empty() && s.Matches(labels.Set(set))
}

// podsSelected returns the workloads whose pods sel selects.
func podsSelected(t *testing.T, ws []workload, sel *metav1.LabelSelector) []workload {
	t.Helper()
	var out []workload
	for _, w := range ws {
		if selects(t, sel, w.template.Labels) {
			out = append(out, w)
		}
	}
	return out
}

// portOf returns the container port that a probe's or a Service's port
// names or numbers, in the pod's containers.
func portOf(spec corev1.PodSpec, p intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, c := range spec.Containers {
		for _, cp := range c.Ports {
			if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
				return cp, true
			}
		}
	}
	return corev1.ContainerPort{}, false
}

// TestSelectorsAndPorts checks that every selector selects the pods (or the
// Service) it is for, and that every port it names exists there.
func TestSelectorsAndPorts(t *testing.T) {
	_, o := load(t)
	ws := workloads(o)
	for _, w := range ws {
		if !selects(t, w.selector, w.template.Labels) {
			t.Errorf("%s %s: selector %v does not select its own pods %v", w.kind, w.name, w.selector, w.template.Labels)
		}
	}
	svcs := map[string]*corev1.Service{}
	for _, s := range o.services {
		svcs[s.Name] = s
		matched := podsSelected(t, ws, &metav1.LabelSelector{MatchLabels: s.Spec.Selector})
		if len(matched) != 1 {
			t.Errorf("Service %s: selector %v selects %d workloads, want 1", s.Name, s.Spec.Selector, len(matched))
			continue
		}
		for _, p := range s.Spec.Ports {
			if _, ok := portOf(matched[0].template.Spec, p.TargetPort); !ok {
				t.Errorf("Service %s: port %s targets %s, which %s %s does not expose", s.Name, p.Name, p.TargetPort.String(), matched[0].kind, matched[0].name)
			}
		}
	}
	for _, s := range o.statefulSets {
		svc := svcs[s.Spec.ServiceName]
		switch {
		case svc == nil:
			t.Errorf("StatefulSet %s: serviceName %s: no such Service", s.Name, s.Spec.ServiceName)
		case svc.Spec.ClusterIP != corev1.ClusterIPNone:
			t.Errorf("StatefulSet %s: Service %s is not headless: its pods get no stable DNS names", s.Name, svc.Name)
		}
	}
	for _, p := range o.pdbs {
		if n := len(podsSelected(t, ws, p.Spec.Selector)); n != 1 {
			t.Errorf("PodDisruptionBudget %s selects %d workloads, want 1", p.Name, n)
		}
	}
	for _, h := range o.hpas {
		ref := h.Spec.ScaleTargetRef
		if !slices.ContainsFunc(o.deployments, func(d *appsv1.Deployment) bool { return d.Name == ref.Name }) || ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" {
			t.Errorf("HorizontalPodAutoscaler %s: scales %s %s %s, not a Deployment here", h.Name, ref.APIVersion, ref.Kind, ref.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 {
			t.Errorf("HorizontalPodAutoscaler %s: minReplicas %v: want at least 2, so that a PodDisruptionBudget leaves one", h.Name, h.Spec.MinReplicas)
		}
	}
	// The rules select job="poplimit-edge" and job="poplimit-aggregator".
	for _, pm := range o.podMonitors {
		matched := podsSelected(t, ws, &pm.Spec.Selector)
		if len(matched) != 1 {
			t.Errorf("PodMonitor %s selects %d workloads, want 1", pm.Name, len(matched))
			continue
		}
		if job := matched[0].template.Labels[pm.Spec.JobLabel]; job != "poplimit-edge" {
			t.Errorf("PodMonitor %s: jobLabel %q gives job %q, want poplimit-edge", pm.Name, pm.Spec.JobLabel, job)
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if ep.Port == nil {
				t.Errorf("PodMonitor %s: an endpoint without a port name", pm.Name)
				continue
			}
			if _, ok := portOf(matched[0].template.Spec, intstr.FromString(*ep.Port)); !ok {
				t.Errorf("PodMonitor %s: port %s is not a port of %s", pm.Name, *ep.Port, matched[0].name)
			}
			if ep.Path != "/metrics" {
				t.Errorf("PodMonitor %s: path %q, want /metrics", pm.Name, ep.Path)
			}
		}
	}
	for _, sm := range o.serviceMonitors {
		var matched []*corev1.Service
		for _, s := range o.services {
			if selects(t, &sm.Spec.Selector, s.Labels) {
				matched = append(matched, s)
			}
		}
		if len(matched) != 1 {
			t.Errorf("ServiceMonitor %s selects %d Services, want 1", sm.Name, len(matched))
			continue
		}
		if job := matched[0].Labels[sm.Spec.JobLabel]; job != "poplimit-aggregator" {
			t.Errorf("ServiceMonitor %s: jobLabel %q gives job %q, want poplimit-aggregator", sm.Name, sm.Spec.JobLabel, job)
		}
		for _, ep := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(matched[0].Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
				t.Errorf("ServiceMonitor %s: port %q is not a port of Service %s", sm.Name, ep.Port, matched[0].Name)
			}
			if ep.Path != "/metrics" {
				t.Errorf("ServiceMonitor %s: path %q, want /metrics", sm.Name, ep.Path)
			}
		}
	}
}

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
		if name == "poplimit-edge" {
			srcDirs = append(srcDirs, filepath.Join("..", "..", "edge"))
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

// rulesSpec reads deploy/prometheus/rules/*.yml, in file name order, as the
// PrometheusRule's spec, decoding each strictly.
func rulesSpec(t *testing.T) (monitoringv1.PrometheusRuleSpec, []string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(rulesDir, "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no rule files in %s: %v", rulesDir, err)
	}
	slices.Sort(files)
	var spec monitoringv1.PrometheusRuleSpec
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var part monitoringv1.PrometheusRuleSpec
		if err := yaml.UnmarshalStrict(b, &part); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		spec.Groups = append(spec.Groups, part.Groups...)
	}
	return spec, files
}

// generatePrometheusRule writes the PrometheusRule text: each rule file's
// groups, comments kept, indented under spec.
func generatePrometheusRule(t *testing.T, files []string) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteString(`# Code generated by "go test ./deploy/k8s -run TestPrometheusRule -update"; DO NOT EDIT.
#
# The groups of deploy/prometheus/rules/*.yml, for the Prometheus Operator.
# Edit those files (and their promtool tests) and run the command above;
# go test ./deploy/... fails while the two disagree.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: poplimit
  labels:
    app.kubernetes.io/name: poplimit
    app.kubernetes.io/component: monitoring
spec:
  groups:
`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		_, body, ok := strings.Cut(string(src), "\ngroups:\n")
		if !ok {
			t.Fatalf("%s: no top-level \"groups:\" line", f)
		}
		fmt.Fprintf(&b, "    # deploy/prometheus/rules/%s\n", filepath.Base(f))
		for _, line := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
			if line == "" {
				b.WriteString("\n")
				continue
			}
			b.WriteString("  " + line + "\n")
		}
	}
	return b.Bytes()
}

// TestPrometheusRule checks that prometheusrule.yaml holds exactly the
// groups of deploy/prometheus/rules, which promtool tests.
func TestPrometheusRule(t *testing.T) {
	spec, files := rulesSpec(t)
	if *update {
		if err := os.WriteFile(prometheusRuleFile, generatePrometheusRule(t, files), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, o := load(t)
	if len(o.prometheusRules) != 1 {
		t.Fatalf("want one PrometheusRule, have %d", len(o.prometheusRules))
	}
	got := o.prometheusRules[0].Spec
	if !reflect.DeepEqual(got, spec) {
		for i := range max(len(got.Groups), len(spec.Groups)) {
			var g, w monitoringv1.RuleGroup
			if i < len(got.Groups) {
				g = got.Groups[i]
			}
			if i < len(spec.Groups) {
				w = spec.Groups[i]
			}
			if !reflect.DeepEqual(g, w) {
				t.Errorf("group %d differs: %s has %q, the rule files %q", i, prometheusRuleFile, g.Name, w.Name)
			}
		}
		t.Fatalf("%s disagrees with %s: run go test ./deploy/k8s -run TestPrometheusRule -update", prometheusRuleFile, rulesDir)
	}
	// The generated text is what is checked in, comments included.
	if b, err := os.ReadFile(prometheusRuleFile); err != nil || !bytes.Equal(b, generatePrometheusRule(t, files)) {
		t.Errorf("%s is not what the generator writes (err %v): run go test ./deploy/k8s -run TestPrometheusRule -update", prometheusRuleFile, err)
	}
}

// TestKustomizeBuild builds the base with kubectl's kustomize, when kubectl
// is installed, and decodes its output strictly: the generators, the
// labels and the image override apply.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not found: the base is checked file by file only (kubectl is not in Debian's main archive; see kubernetes.io)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, kubectl, "kustomize", ".")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, stderr.String())
	}
	built := &objects{}
	if err := decodeDocs(out, "kubectl kustomize", built); err != nil {
		t.Fatal(err)
	}
	_, src := load(t)
	if len(built.configMaps) != len(src.configMaps) || len(built.deployments) != len(src.deployments) ||
		len(built.services) != len(src.services) || len(built.prometheusRules) != 1 {
		t.Errorf("built %d ConfigMaps, %d Deployments, %d Services; the base has %d, %d, %d",
			len(built.configMaps), len(built.deployments), len(built.services), len(src.configMaps), len(src.deployments), len(src.services))
	}
	names := map[string]bool{}
	for _, cm := range built.configMaps {
		names[cm.Name] = true
		if cm.Labels["app.kubernetes.io/part-of"] != "poplimit" {
			t.Errorf("ConfigMap %s: no part-of label", cm.Name)
		}
	}
	if !names["poplimit-rules"] {
		t.Errorf("ConfigMaps %v: want poplimit-rules without a hash suffix, so that edges reload it in place", names)
	}
	for _, d := range built.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			if !strings.HasPrefix(c.Image, "registry.invalid/poplimit:") {
				t.Errorf("Deployment %s: image %q: the images override did not apply", d.Name, c.Image)
			}
			for _, e := range c.Env {
				if ref := e.ValueFrom; ref != nil && ref.ConfigMapKeyRef != nil && !names[ref.ConfigMapKeyRef.Name] {
					t.Errorf("Deployment %s: env %s refers to ConfigMap %s, which the build does not have", d.Name, e.Name, ref.ConfigMapKeyRef.Name)
				}
			}
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.ConfigMap != nil && !names[v.ConfigMap.Name] {
					t.Errorf("Deployment %s: volume %s refers to ConfigMap %s, which the build does not have", d.Name, v.Name, v.ConfigMap.Name)
				}
			}
		}
	}
}
