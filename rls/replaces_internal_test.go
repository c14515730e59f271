package rls

import (
	"slices"
	"testing"

	"github.com/poplimit/poplimit/rules"
)

// TestApplyReplaces: a limit is replaced when any descriptor of the same
// request names it in its replaces, whatever their order, and unlimited
// and replaced limits replace too (ratelimit's constructLimitsToCheck);
// unnamed limits and descriptors without a limit are never replaced.
func TestApplyReplaces(t *testing.T) {
	counted := func(name string, replaces ...string) rules.DescriptorMatch {
		return rules.DescriptorMatch{Answer: rules.DescriptorCounted, Name: name, Replaces: replaces}
	}
	unlimited := func(name string, replaces ...string) rules.DescriptorMatch {
		return rules.DescriptorMatch{Answer: rules.DescriptorUnlimited, Name: name, Replaces: replaces}
	}
	tests := []struct {
		name string
		ms   []rules.DescriptorMatch
		want []bool
	}{
		{"alone", []rules.DescriptorMatch{counted("specific_limit")}, []bool{false}},
		{"the 10/s replaces the 5/s", []rules.DescriptorMatch{counted("specific_limit"), counted("", "specific_limit")}, []bool{true, false}},
		{"other order", []rules.DescriptorMatch{counted("", "specific_limit"), counted("specific_limit")}, []bool{false, true}},
		{"an unlimited limit replaces", []rules.DescriptorMatch{unlimited("", "a"), counted("a")}, []bool{false, true}},
		{"a replaced limit still replaces", []rules.DescriptorMatch{counted("a", "b"), counted("b"), counted("c", "a")}, []bool{true, true, false}},
		{"each other", []rules.DescriptorMatch{counted("a", "b"), counted("b", "a")}, []bool{true, true}},
		{"a limit replacing itself", []rules.DescriptorMatch{counted("a", "a")}, []bool{true}},
		{"unnamed: never replaced", []rules.DescriptorMatch{counted(""), counted("x", "")}, []bool{false, false}},
		{"no limit: never replaced", []rules.DescriptorMatch{{Answer: rules.DescriptorNone, Name: "a"}, counted("", "a")}, []bool{false, false}},
		{"a name not in the request", []rules.DescriptorMatch{counted("a", "z"), counted("b")}, []bool{false, false}},
	}
	for _, tt := range tests {
		ds := make([]rlsDesc, len(tt.ms))
		for i, m := range tt.ms {
			ds[i].m = m
		}
		applyReplaces(ds)
		got := make([]bool, len(ds))
		for i := range ds {
			got[i] = ds[i].replaced
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: replaced got %v, want %v", tt.name, got, tt.want)
		}
	}
}
