package judge

import (
	"testing"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want int // problems reported
	}{
		{"defaults", func(*Config) {}, 0},
		{"zero", func(c *Config) { *c = Config{} }, 7},
		{"negative lateness and hold", func(c *Config) { c.AllowedLateness, c.Hold = -1, -1 }, 2},
		{"negative clock bounds", func(c *Config) { c.MaxClockSkew, c.MaxEventAge = -1, -1 }, 2},
		{"clock bounds off", func(c *Config) { c.MaxClockSkew, c.MaxEventAge = 0, 0 }, 0},
		{"top keys past the list", func(c *Config) { c.TopKeys = c.MaxWrongKeys + 1 }, 1},
	}
	for _, tt := range tests {
		cfg := DefaultConfig()
		tt.mod(&cfg)
		err := cfg.Validate()
		got := 0
		if err != nil {
			got = len(err.(interface{ Unwrap() []error }).Unwrap())
		}
		if got != tt.want {
			t.Errorf("%s: got %d problems (%v), want %d", tt.name, got, err, tt.want)
		}
	}
	if _, err := New(Config{}, nil); err == nil {
		t.Error("New with a zero Config: got nil error, want one")
	}
}
