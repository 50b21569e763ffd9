package peer_test

import (
	"context"
	"log/slog"

	"go.etcd.io/raft/v3"

	"github.com/ticketd/ticketd/transports/peer"
)

// Wiring a transport to a raft.Node, which satisfies Raft: Start binds it,
// so inbound messages go to its Step and failures to its Report methods,
// and the Ready loop hands rd.Messages to Send once the entries and
// HardState are durable.
func Example() {
	var node raft.Node // started elsewhere with raft.StartNode / RestartNode
	tr, err := peer.New(peer.Config{
		ID:     1,
		Listen: "10.0.0.1:7400",
		Peers:  map[uint64]string{2: "10.0.0.2:7400", 3: "10.0.0.3:7400"},
		Secret: []byte("a cluster secret of 16+ bytes, from a file"),
		Logger: slog.Default(),
	})
	if err != nil {
		panic(err)
	}
	if err := tr.Start(context.Background(), node); err != nil {
		panic(err)
	}
	defer tr.Close()

	for rd := range node.Ready() {
		// ... persist rd.Entries, rd.HardState, rd.Snapshot ...
		tr.Send(rd.Messages)
		node.Advance()
	}
}
