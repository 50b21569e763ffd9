package core_test

import (
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// A fence key's seed never shows when a command or the control state that
// carries it is formatted, whatever the verb a log line or an error uses.
func TestFenceSeedNeverFormatted(t *testing.T) {
	var seed core.FenceSeed
	for i := range seed {
		seed[i] = byte(0xa0 + i%16)
	}
	m := v3Machine(t)
	cmd := core.SetFenceKey(seed)
	if r := m.Apply(cmd); r.Kind != core.ResultControlApplied {
		t.Fatalf("SetFenceKey = %v", r)
	}
	state := m.ControlState()
	leaks := []string{hex.EncodeToString(seed[:]), fmt.Sprint(seed[:]), fmt.Sprintf("%#v", seed[:])}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%q"} {
		for name, v := range map[string]any{"command": cmd, "*command": &cmd, "control state": state, "seed": seed} {
			out := fmt.Sprintf(verb, v)
			for _, leak := range leaks {
				if strings.Contains(out, leak) || strings.Contains(out, strings.Trim(leak, "[]")) {
					t.Errorf("%s formatted with %s shows the seed: %.300s", name, verb, out)
				}
			}
		}
	}
}
