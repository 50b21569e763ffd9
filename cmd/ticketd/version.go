package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
)

// versionText is what `ticketd version` and `ticketd --version` print:
// what an operator compares across nodes before and during an upgrade
// (docs/operations.md): the release, the VCS revision the binary was
// built from, the Go version, and the newest formats it reads and writes.
func versionText() string {
	release, revision := "(unknown)", "(unknown: built without VCS information)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		release = bi.Main.Version
		var rev, at, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			revision = rev
			if at != "" {
				revision += " (" + at + ")"
			}
			if modified == "true" {
				revision += " +uncommitted changes"
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ticketd %s\n", release)
	fmt.Fprintf(&b, "revision:        %s\n", revision)
	fmt.Fprintf(&b, "go:              %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "cluster version: %d (highest supported; log entry format %d)\n", core.MaxClusterVersion, core.MaxEntryVersion)
	fmt.Fprintf(&b, "backup format:   %d\n", control.BackupVersion)
	return b.String()
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the release, VCS revision, Go version and supported cluster version",
		Long: `Print the release, VCS revision, Go version and the highest cluster version
(formats) this binary supports. Compare it across nodes before and during a
rolling upgrade: the cluster moves to a new cluster version only once every
member supports it.`,
		Example: `  ticketd version
  ticketd --version`,
		Args: exactArgs(),
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprint(cmd.OutOrStdout(), versionText())
		},
	}
}
