package xds

import (
	"fmt"
	"strconv"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// TypeURL is the type of the resources a Subscriber asks for:
// go-control-plane's RateLimitConfig (its resource.RateLimitConfigType).
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Files converts the resources of one state-of-the-world response into
// envoyproxy/ratelimit configuration files, name → YAML, as
// envoyproxy/ratelimit converts them (its config.ConfigXdsProtoToYaml): one
// file per RateLimitConfig, named by its name ("resource[i]" when it has
// none), holding its domain and descriptors. The files are then loaded as
// files are, by rules/envoyconf, which validates them. A resource of
// another type, one that does not decode, or two of one name is an error
// naming it.
func Files(resources []*anypb.Any) (map[string][]byte, error) {
	files := make(map[string][]byte, len(resources))
	for i, res := range resources {
		if res.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("xds: resource[%d]: type %q: want %q", i, res.GetTypeUrl(), TypeURL)
		}
		var c rlsconf.RateLimitConfig
		if err := anypb.UnmarshalTo(res, &c, proto.UnmarshalOptions{}); err != nil {
			return nil, fmt.Errorf("xds: resource[%d]: %w", i, err)
		}
		name := c.GetName()
		if name == "" {
			name = "resource[" + strconv.Itoa(i) + "]"
		}
		if _, dup := files[name]; dup {
			return nil, fmt.Errorf("xds: resource[%d]: name %q: two resources of one name", i, name)
		}
		data, err := YAML(&c)
		if err != nil {
			return nil, fmt.Errorf("xds: resource[%d] %q: %w", i, name, err)
		}
		files[name] = data
	}
	return files, nil
}

// YAML writes one RateLimitConfig as the envoyproxy/ratelimit file that
// says the same: domain, and descriptors with their key, value,
// rate_limit (requests_per_unit, unit, unlimited, name, replaces),
// shadow_mode and detailed_metric, nested. A unit of UNKNOWN (unset) is
// left out, as ratelimit reads it: no unit.
func YAML(c *rlsconf.RateLimitConfig) ([]byte, error) {
	root := yamlRoot{Domain: c.GetDomain(), Descriptors: descriptorsOf(c.GetDescriptors(), 0)}
	return yaml.Marshal(&root)
}

// maxDepth bounds the nesting converted; deeper descriptors are cut, and
// the loader then reports the limit they lacked. A proto decoder already
// refuses nesting beyond 100.
const maxDepth = 100

type yamlRoot struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value,omitempty"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit,omitempty"`
	Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
	ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
	DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
}

type yamlRateLimit struct {
	RequestsPerUnit uint32        `yaml:"requests_per_unit"`
	Unit            string        `yaml:"unit,omitempty"`
	Unlimited       bool          `yaml:"unlimited,omitempty"`
	Name            string        `yaml:"name,omitempty"`
	Replaces        []yamlReplace `yaml:"replaces,omitempty"`
}

type yamlReplace struct {
	Name string `yaml:"name"`
}

func descriptorsOf(ds []*rlsconf.RateLimitDescriptor, depth int) []yamlDescriptor {
	if len(ds) == 0 || depth >= maxDepth {
		return nil
	}
	out := make([]yamlDescriptor, len(ds))
	for i, d := range ds {
		out[i] = yamlDescriptor{
			Key: d.GetKey(), Value: d.GetValue(),
			RateLimit:      rateLimitOf(d.GetRateLimit()),
			Descriptors:    descriptorsOf(d.GetDescriptors(), depth+1),
			ShadowMode:     d.GetShadowMode(),
			DetailedMetric: d.GetDetailedMetric(),
		}
	}
	return out
}

func rateLimitOf(p *rlsconf.RateLimitPolicy) *yamlRateLimit {
	if p == nil {
		return nil
	}
	r := &yamlRateLimit{RequestsPerUnit: p.GetRequestsPerUnit(), Unlimited: p.GetUnlimited(), Name: p.GetName()}
	if u := p.GetUnit(); u != rlsconf.RateLimitUnit_UNKNOWN {
		r.Unit = u.String() // a number the enum does not name stays a number, which the loader refuses
	}
	for _, rp := range p.GetReplaces() {
		r.Replaces = append(r.Replaces, yamlReplace{Name: rp.GetName()})
	}
	return r
}
