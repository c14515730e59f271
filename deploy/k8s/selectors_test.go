package k8s

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

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
