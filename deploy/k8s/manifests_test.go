// Package k8s is the kustomize base of deploy/k8s; it holds no code, only
// the test that decodes every manifest into the Kubernetes API types,
// strictly, and checks it against the binaries: flags, ports, probes,
// labels and selectors, config keys, and the PrometheusRule against
// deploy/prometheus/rules.
package k8s

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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
