package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/daemon"
)

// TestConfigNamesWhereAnUnknownKeyCameFrom: serve refuses keys no setting
// knows, and says where each came from, so that a stray TICKETD_* variable
// (a test's or a script's) is recognisable as one.
func TestConfigNamesWhereAnUnknownKeyCameFrom(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ticketd.yaml")
	if err := os.WriteFile(file, []byte("data: d1\nlog-levle: debug\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     []string
		wantErr []string // substrings; nil: accepted
	}{
		{name: "known variable", env: []string{"TICKETD_LOG_LEVEL=debug", "PATH=/bin"}},
		{name: "unknown variable", env: []string{"TICKETD_BENCH_BIN=/tmp/x", "TICKETD_LOG_LEVEL=debug"},
			wantErr: []string{"unknown keys TICKETD_BENCH_BIN in the environment", "unset it"}},
		{name: "two unknown variables", env: []string{"TICKETD_BIG=1", "TICKETD_FIGURES=1"},
			wantErr: []string{"unknown keys TICKETD_BIG, TICKETD_FIGURES in the environment"}},
		{name: "unknown key in the file", args: []string{"--config", file},
			wantErr: []string{"unknown keys log-levle (in " + file + ")"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := serveFlags()
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			_, err := configFrom(fs, tc.env)
			if tc.wantErr == nil {
				if err != nil && errors.Is(err, daemon.ErrConfig) && strings.Contains(err.Error(), "unknown keys") {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, daemon.ErrConfig) {
				t.Fatalf("err %v, want a config error", err)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err %q does not say %q", err, w)
				}
			}
		})
	}
}
