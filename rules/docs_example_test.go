package rules

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// yamlBlocks returns the ```yaml blocks of a Markdown document.
func yamlBlocks(doc string) []string {
	var blocks []string
	for {
		_, rest, ok := strings.Cut(doc, "```yaml\n")
		if !ok {
			return blocks
		}
		block, after, ok := strings.Cut(rest, "```")
		if !ok {
			return blocks
		}
		blocks = append(blocks, block)
		doc = after
	}
}

// TestDocumentedExamplesParse checks that every rules file and overrides
// file the user documents show is accepted as written: a block whose first
// key is match, shedding or rules is a rules file, one whose first key is
// overrides an overrides file. Other blocks (fragments of
// envoyproxy/ratelimit files) are left to package envoyconf.
func TestDocumentedExamplesParse(t *testing.T) {
	checked := 0
	for _, f := range []string{filepath.Join("..", "README.md"), filepath.Join("..", "docs", "CONFIGURATION.md")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, block := range yamlBlocks(string(b)) {
			first, _, _ := strings.Cut(strings.TrimSpace(block), ":")
			switch first {
			case "match", "shedding", "rules":
				rs, err := ParseRules([]byte(block))
				if err != nil {
					t.Errorf("%s, yaml block %d: %v", f, i, err)
					continue
				}
				if len(rs.Rules) == 0 {
					t.Errorf("%s, yaml block %d: got no rules, want the example's", f, i)
				}
			case "overrides":
				if _, err := ParseOverrides([]byte(block)); err != nil {
					t.Errorf("%s, yaml block %d: %v", f, i, err)
				}
			default:
				continue
			}
			checked++
		}
	}
	if checked < 3 {
		t.Errorf("checked %d documented examples, want at least 3 (README's rules, CONFIGURATION.md's rules and overrides)", checked)
	}
}
