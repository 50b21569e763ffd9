// Command loop is a test guest that never returns from validate_grant
// when the key is "loop" (and from on_applied for a command on key
// "loop"); other keys are allowed.
package main

import "github.com/ticketd/ticketd/sdk/plugin"

func main() {}

var sink int

func init() {
	plugin.HandleValidateGrant(func(r plugin.GrantRequest) plugin.Verdict {
		if r.Key == "loop" {
			spin()
		}
		return plugin.Allow()
	})
	plugin.HandleOnApplied(func(a plugin.Applied) []plugin.Event {
		if a.Command.Key == "loop" {
			spin()
		}
		return nil
	})
}

func spin() {
	for i := 0; ; i++ {
		sink = i
	}
}
