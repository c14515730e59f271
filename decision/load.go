package decision

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/poplimit/poplimit/internal/filestamp"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/rules/envoyconf"
)

// DefaultRules is the built-in rule of an edge started without a rules
// file: 100 requests per minute per client IP.
const DefaultRules = `
rules:
  - name: default-per-client
    limit: 100
    window: 1m
`

// LoadFiles parses the configured rules and overrides files, each file
// at most rules.DefaultMaxFileBytes.
//
// The rules path may also name envoyproxy/ratelimit configuration: a file
// with a top-level domain, or a directory of such files (every *.yaml and
// *.yml, as ratelimit reads its runtime directory), for Envoy's rate limit
// service; overrides do not apply to those.
func LoadFiles(rulesFile, overridesFile string) (*rules.Rules, error) {
	src, err := ReadSources(rulesFile, overridesFile, 0)
	if err != nil {
		return nil, err
	}
	return src.Rules()
}

// Sources are the rules and overrides files' bytes as read once, with a
// stamp of their contents: a watcher compares stamps to see a change and
// parses the very bytes it stamped.
type Sources struct {
	rulesFile, overridesFile string
	envoy                    map[string][]byte // envoyproxy/ratelimit files, by base name
	data                     []byte            // the poplimit rules file (or DefaultRules)
	overrides                []byte
	maxBytes                 int64
	// Stamp names the files and hashes their contents (symlinks
	// followed): equal stamps mean equal bytes.
	Stamp string
}

// ReadSources reads the rules path (a poplimit rules file, an
// envoyproxy/ratelimit file, or a directory of those) and the overrides
// file, refusing any file over maxBytes (0 or less:
// rules.DefaultMaxFileBytes) without reading it.
func ReadSources(rulesFile, overridesFile string, maxBytes int64) (*Sources, error) {
	if maxBytes <= 0 {
		maxBytes = rules.DefaultMaxFileBytes
	}
	s := &Sources{rulesFile: rulesFile, overridesFile: overridesFile, maxBytes: maxBytes, data: []byte(DefaultRules)}
	var stamp []byte
	if rulesFile != "" {
		st, err := os.Stat(rulesFile)
		if err != nil {
			return nil, fmt.Errorf("decision: rules: %w", err)
		}
		if st.IsDir() {
			if s.envoy, err = (envoyconf.Loader{MaxFileBytes: int(maxBytes)}).ReadFiles(rulesFile); err != nil {
				return nil, fmt.Errorf("decision: rules: %w", err)
			}
			stamp = append(stamp, envoyconf.StampOf(s.envoy)...)
		} else {
			if s.data, err = rules.ReadFile(rulesFile, maxBytes); err != nil {
				return nil, fmt.Errorf("decision: rules: %w", err)
			}
			if envoyconf.IsEnvoy(s.data) {
				s.envoy = map[string][]byte{filepath.Base(rulesFile): s.data}
			}
			stamp = filestamp.Append(stamp, rulesFile, s.data)
		}
	}
	if overridesFile != "" {
		var err error
		if s.overrides, err = rules.ReadFile(overridesFile, maxBytes); err != nil {
			return nil, fmt.Errorf("decision: overrides: %w", err)
		}
		stamp = filestamp.Append(stamp, overridesFile, s.overrides)
	}
	s.Stamp = string(stamp)
	return s, nil
}

// Rules parses the sources into rules.
func (s *Sources) Rules() (*rules.Rules, error) {
	if s.envoy != nil {
		if s.overridesFile != "" {
			return nil, fmt.Errorf("decision: %s: envoyproxy/ratelimit files take no overrides file (%s)", s.rulesFile, s.overridesFile)
		}
		rs, err := (envoyconf.Loader{MaxFileBytes: int(s.maxBytes)}).RulesOf(s.envoy)
		if err != nil {
			return nil, fmt.Errorf("decision: %s: %w", s.rulesFile, err)
		}
		return rs, nil
	}
	rs, err := rules.ParseRules(s.data)
	if err != nil {
		return nil, fmt.Errorf("decision: %s: %w", nameOr(s.rulesFile, "built-in rules"), err)
	}
	if s.overridesFile != "" {
		if rs.Overrides, err = rules.ParseOverrides(s.overrides); err != nil {
			return nil, fmt.Errorf("decision: %s: %w", s.overridesFile, err)
		}
	}
	return rs, nil
}

func nameOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
