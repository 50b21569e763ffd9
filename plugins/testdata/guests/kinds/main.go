// Command kinds is a policy guest of plugin ABI version 2, built with the
// SDK: it decides on the lock's kind.
//
//	a semaphore of more than 8 holders          deny "semaphores are limited to 8 holders"
//	a shared hold of a key under "exclusive/"   deny "keys under exclusive/ are exclusive only"
//	anything else                               allow
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
}
