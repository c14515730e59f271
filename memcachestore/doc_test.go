package memcachestore_test

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/poplimit/poplimit/memcachestore"
)

// The documents state how many compare-and-swap rounds an operation gets;
// they must say what the code does.
func TestDocumentsStateTheRounds(t *testing.T) {
	re := regexp.MustCompile(`(?:fresh ` + "`gets`" + `, (\d+) rounds in all|compare-and-swap lost (\d+) rounds)`)
	for _, f := range []string{"../docs/DESIGN.md", "../README.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		ms := re.FindAllSubmatch(b, -1)
		if len(ms) == 0 {
			t.Errorf("%s states no number of compare-and-swap rounds", f)
		}
		for _, m := range ms {
			n, _ := strconv.Atoi(string(m[1]) + string(m[2]))
			if n != memcachestore.StateRounds {
				t.Errorf("%s: %q, but StateRounds is %d", f, m[0], memcachestore.StateRounds)
			}
		}
	}
}
