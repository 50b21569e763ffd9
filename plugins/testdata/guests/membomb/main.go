// Command membomb is a test guest that allocates without bound when the
// key is "bomb", until the host's memory limit makes the Go runtime die;
// other keys are allowed.
package main

import "github.com/ticketd/ticketd/sdk/plugin"

func main() {}

var hoard [][]byte

func init() {
	plugin.HandleValidateGrant(func(r plugin.GrantRequest) plugin.Verdict {
		if r.Key == "bomb" {
			for {
				b := make([]byte, 1<<20)
				for i := 0; i < len(b); i += 4096 {
					b[i] = byte(i >> 12) // touch every page
				}
				hoard = append(hoard, b)
			}
		}
		return plugin.Allow()
	})
}
