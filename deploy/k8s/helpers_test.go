package k8s

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
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
