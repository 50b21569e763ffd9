package daemon

import (
	"errors"
	"testing"
)

// The fair-share settings: positive, a share never above its whole.
func TestValidateShares(t *testing.T) {
	if err := Defaults().validateShares(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cases := []struct {
		name string
		set  func(*Config)
	}{
		{"waiters per identity zero", func(c *Config) { c.MaxWaitersPerIdentity = 0 }},
		{"waiters per identity above the node's", func(c *Config) { c.MaxWaitersPerIdentity = c.MaxWaiters + 1 }},
		{"in-flight zero", func(c *Config) { c.MaxInflight = 0 }},
		{"in-flight huge", func(c *Config) { c.MaxInflight = MaxInflight + 1 }},
		{"in-flight per identity above the node's", func(c *Config) { c.MaxInflightPerIdentity = c.MaxInflight + 1 }},
		{"plugin calls negative", func(c *Config) { c.PluginCallsPerIdentity = -1 }},
		{"plugin time zero", func(c *Config) { c.PluginTimePerIdentityMS = 0 }},
		{"plugin time above every instance's", func(c *Config) { c.PluginTimePerIdentityMS = MaxPluginTimePerIdentityMS + 1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			tc.set(&c)
			if err := c.validateShares(); !errors.Is(err, ErrConfig) {
				t.Fatalf("err %v, want ErrConfig", err)
			}
		})
	}
}
