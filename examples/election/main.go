// Command election is one candidate of a leader election on a ticketd
// key: it campaigns, leads while its term lasts (printing its fencing
// token with every unit of work), campaigns again when the term is lost,
// and resigns on SIGINT or SIGTERM so the next candidate takes over at
// once. Run three of them with different --id values; see README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ticketd/ticketd/sdk"
)

func main() {
	url := flag.String("nats", "nats://127.0.0.1:4222", "NATS URL(s) of the cluster, comma-separated")
	key := flag.String("key", "election/demo", "the key the candidates elect on")
	id := flag.String("id", "", "this candidate's id (required)")
	lease := flag.Duration("lease", 2*time.Second, "the leader's lease: a dead leader is replaced within it")
	work := flag.Duration("work", 200*time.Millisecond, "how often the leader does a unit of work")
	flag.Parse()
	if *id == "" {
		fmt.Fprintln(os.Stderr, "election: --id is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *url, *key, *id, *lease, *work); err != nil {
		fmt.Fprintln(os.Stderr, "election:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, key, id string, lease, work time.Duration) error {
	c, err := sdk.Connect(url)
	if err != nil {
		return err
	}
	defer c.Close()
	e, err := sdk.NewElection(c, key, id, lease)
	if err != nil {
		return err
	}
	go observe(ctx, e, id)
	for ctx.Err() == nil {
		fmt.Printf("%s campaigning\n", id)
		if err := e.Campaign(ctx); err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		fmt.Printf("%s elected token=%d\n", id, e.Token())
		lead(ctx, e, id, work)
	}
	return nil
}

// lead works while the term lasts; on shutdown it resigns.
func lead(ctx context.Context, e *sdk.Election, id string, work time.Duration) {
	tick := time.NewTicker(work)
	defer tick.Stop()
	for {
		select {
		case <-e.Lost():
			fmt.Printf("%s term lost token=%d: %v\n", id, e.Token(), context.Cause(e.Context()))
			return
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := e.Resign(rctx); err != nil {
				fmt.Printf("%s resigning token=%d failed: %v (the term ends within its lease)\n", id, e.Token(), err)
			} else {
				fmt.Printf("%s resigning token=%d: done\n", id, e.Token())
			}
			return
		case <-tick.C:
			// Every write the leader makes carries its term's token; the
			// resource refuses tokens lower than the highest it has seen.
			fmt.Printf("%s working token=%d\n", id, e.Token())
		}
	}
}

// observe prints every leader change this candidate sees.
func observe(ctx context.Context, e *sdk.Election, id string) {
	changes, err := e.Observe(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "election: observe:", err)
		return
	}
	for h := range changes {
		if h.Held {
			fmt.Printf("%s observed leader=%s token=%d\n", id, h.Owner, h.Token)
		} else {
			fmt.Printf("%s observed no leader\n", id)
		}
	}
}
