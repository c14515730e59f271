package algo_test

import (
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
)

func algOK(ok bool, _, _ int64) bool { return ok }

func TestTokenBucketValidate(t *testing.T) {
	tests := []struct {
		tb   algo.TokenBucket
		want []string // substrings, one per problem
	}{
		{algo.TokenBucket{Rate: 10, Per: time.Second, Burst: 20}, nil},
		{algo.TokenBucket{Rate: 0, Per: time.Second, Burst: 20}, []string{"TokenBucket.Rate 0"}},
		{algo.TokenBucket{Rate: 1, Per: -time.Second, Burst: 20}, []string{"TokenBucket.Per -1s"}},
		{algo.TokenBucket{Rate: 1, Per: time.Second, Burst: -3}, []string{"TokenBucket.Burst -3"}},
		{algo.TokenBucket{}, []string{"Rate 0", "Per 0s", "Burst 0"}},
		{algo.TokenBucket{Rate: 1, Per: time.Hour, Burst: 10_000_000}, []string{"Burst 10000000 × Per 1h0m0s overflows"}},
	}
	for _, tt := range tests {
		err := tt.tb.Validate()
		if (err == nil) != (tt.want == nil) {
			t.Errorf("%+v.Validate() = %v, want problems %q", tt.tb, err, tt.want)
			continue
		}
		if err == nil {
			continue
		}
		if got := strings.Count(err.Error(), "\n") + 1; got != len(tt.want) {
			t.Errorf("%+v.Validate() = %q: %d problems, want %d", tt.tb, err, got, len(tt.want))
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v.Validate() = %q, want it to mention %q", tt.tb, err, w)
			}
		}
	}
}
