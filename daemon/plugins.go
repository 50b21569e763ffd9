package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ticketd/ticketd/plugins"
)

// loadPlugins reads and compiles every module named in cfg.Plugins.
func loadPlugins(ctx context.Context, cfg Config, log *slog.Logger) (*plugins.Set, error) {
	var loaded []*plugins.Plugin
	for _, path := range strings.Split(cfg.Plugins, ",") {
		path = strings.TrimSpace(path)
		if path == "" {
			continue
		}
		wasm, err := os.ReadFile(path)
		if err != nil {
			closeAll(ctx, loaded)
			return nil, configErr("plugin %s: %v", path, err)
		}
		p, err := plugins.Load(ctx, wasm, plugins.Config{
			Name:             strings.TrimSuffix(filepath.Base(path), ".wasm"),
			MemoryLimitPages: cfg.PluginMemoryPages,
			CallTimeout:      time.Duration(cfg.PluginCallTimeoutMS) * time.Millisecond,
			IdentityCalls:    cfg.PluginCallsPerIdentity,
			IdentityTime:     time.Duration(cfg.PluginTimePerIdentityMS) * time.Millisecond,
			Logger:           log.With("plugin", filepath.Base(path)),
		})
		if err != nil {
			closeAll(ctx, loaded)
			return nil, fmt.Errorf("daemon: load plugin %s: %w", path, err)
		}
		log.Info("plugin loaded", "plugin", p.Name(), "sha256", p.SHA256(), "policy", p.HasPolicy(), "audit", p.HasAudit())
		loaded = append(loaded, p)
	}
	if len(loaded) == 0 {
		return nil, nil
	}
	return plugins.NewSet(loaded...), nil
}

func closeAll(ctx context.Context, ps []*plugins.Plugin) {
	for _, p := range ps {
		_ = p.Close(ctx)
	}
}
