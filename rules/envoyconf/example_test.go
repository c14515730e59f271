package envoyconf_test

import (
	"fmt"
	"time"

	"github.com/poplimit/poplimit/rules/envoyconf"
)

func ExampleConfig_Lookup() {
	cfg, err := envoyconf.Parse("messaging.yaml", []byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	entries := []envoyconf.Entry{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: "2061111111"}}
	m := cfg.Lookup("messaging", entries)
	now := time.Unix(1_700_000_000, 0)
	fmt.Println(m.Limit.RequestsPerUnit, m.Limit.Unit, m.Limit.Algorithm)
	fmt.Println(string(m.AppendStatsKey(nil)))
	fmt.Println(string(m.AppendCacheKey(nil, "", now)))
	fmt.Println(m.Limit.UntilReset(now))
	// Output:
	// 5 day fixed_window
	// messaging.message_type_marketing.to_number
	// messaging_message_type_marketing_to_number_2061111111_1699920000
	// 1h46m40s
}

func ExampleParse_errors() {
	_, err := envoyconf.Parse("bad.yaml", []byte(`
domain: d
descriptors:
  - key: k
    rate_limit: {unit: fortnight, requests_per_unit: 5, algorithm: token_bucket, burst: 0}
`))
	fmt.Println(err)
	// Output:
	// envoyconf: 2 errors:
	// 	bad.yaml:5:24: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight' (want second, minute, hour, day, week, month or year)
	// 	bad.yaml:5:89: descriptors[0].rate_limit.burst: must be between 1 and 4294967295 (got 0)
}
