// Command kinds is a policy and audit guest of plugin ABI version 2,
// built with the SDK: it decides on the lock's kind,
//
//	a semaphore of more than 8 holders          deny "semaphores are limited to 8 holders"
//	a shared hold of a key under "exclusive/"   deny "keys under exclusive/ are exclusive only"
//	anything else                               allow
//
// and turns every applied command of a semaphore holder or a shared hold
// into one event, kinds.<command kind> {key, token, limit, mode} (the
// result's token for a grant, the command's otherwise); other commands
// emit nothing.
package main

import (
	"strings"

	"github.com/ticketd/ticketd/sdk/plugin"
)

func main() {}

func init() {
	plugin.HandleValidateGrant(func(r plugin.GrantRequest) plugin.Verdict {
		switch {
		case r.Limit > 8:
			return plugin.Deny("semaphores are limited to 8 holders")
		case r.Shared() && strings.HasPrefix(r.Key, "exclusive/"):
			return plugin.Deny("keys under exclusive/ are exclusive only")
		}
		return plugin.Allow()
	})
	plugin.HandleOnApplied(func(a plugin.Applied) []plugin.Event {
		c := a.Command
		if c.Limit < 2 && c.Mode != plugin.ModeShared {
			return nil
		}
		token := c.Token
		if c.Kind == plugin.KindGrant {
			token = a.Result.Token
		}
		return []plugin.Event{{Type: "kinds." + c.Kind, Data: plugin.Fields{
			{Name: "key", Value: c.Key}, {Name: "token", Value: token}, {Name: "limit", Value: c.Limit}, {Name: "mode", Value: c.Mode},
		}}}
	})
}
