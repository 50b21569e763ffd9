package raftstore

import (
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
)

// Applied describes one applied log entry.
type Applied struct {
	Index   uint64
	Term    uint64
	Command core.Command
	Result  core.Result
	// LeaseMS is the lock's lease after a Grant or Renew took effect
	// (Granted, Renewed); 0 for every other result. A renewal never
	// shortens a lease, so for a Renew it may exceed Command.LeaseMS.
	LeaseMS uint64
	// Keys are the keys of the locks a CloseSession or ExpireSession
	// ended (ResultSessionClosed, or ResultSessionExpired with Existed),
	// in key order: Result.Count of them. An expiry left each of them in
	// its session's lock-delay when that is not 0. A key repeats once per
	// holder of it the session had (a semaphore's slots, cluster version
	// 5).
	Keys []string
	// Ended are those locks themselves, as they were before the command
	// (key then token order, Keys[i] == Ended[i].Key): which holder of a
	// multi-holder key ended, and whether it left a delayed slot
	// (core.Machine.Delays of the key).
	Ended []core.Lock
	// Limit and Mode are, for a Grant, Renew, Release, Settle, Expire or
	// ClearDelay of a multi-holder key (a semaphore, or a read/write key
	// with shared holders; cluster version 5), the key's kind: read after
	// a Grant or Renew, before a Release, Settle, Expire or ClearDelay (which may
	// leave the key with neither holder nor slot). Zero for a mutex or an
	// exclusive lock. What watch and audit events name the holder with.
	Limit uint32
	Mode  core.Mode
}

// Observer hears what the node did, in log order, once it is durable: a
// command once its entry is committed and in this node's durable log (its
// state rows may still be on their way to disk, deliverApplied), the rest
// once the Ready that did it is written.
// Calls come from the Ready loop: they must be quick and must not call
// back into Node methods that wait for the loop (Propose, ReadIndex,
// ProposeConfChange, Status, Step).
type Observer interface {
	// OnApplied is called for every applied lock command.
	OnApplied(a Applied)
	// OnLeaderReady is called when this node, as leader of term, has
	// applied every entry before its term: the lock table is complete.
	OnLeaderReady(term uint64)
	// OnLeadershipLost is called when this node stops being leader.
	OnLeadershipLost()
	// OnRestored is called after a received snapshot replaced the state.
	OnRestored(index uint64)
	// OnConfChange is called after a membership change was applied.
	OnConfChange(cc raftpb.ConfChangeV2, cs raftpb.ConfState)
}

// ObserverFuncs is an Observer made of functions, for observers that need
// only some of the events; a nil function ignores its event.
type ObserverFuncs struct {
	Applied        func(a Applied)
	LeaderReady    func(term uint64)
	LeadershipLost func()
	Restored       func(index uint64)
	ConfChange     func(cc raftpb.ConfChangeV2, cs raftpb.ConfState)
}

var _ Observer = ObserverFuncs{}

// OnApplied implements Observer.
func (o ObserverFuncs) OnApplied(a Applied) {
	if o.Applied != nil {
		o.Applied(a)
	}
}

// OnLeaderReady implements Observer.
func (o ObserverFuncs) OnLeaderReady(term uint64) {
	if o.LeaderReady != nil {
		o.LeaderReady(term)
	}
}

// OnLeadershipLost implements Observer.
func (o ObserverFuncs) OnLeadershipLost() {
	if o.LeadershipLost != nil {
		o.LeadershipLost()
	}
}

// OnRestored implements Observer.
func (o ObserverFuncs) OnRestored(index uint64) {
	if o.Restored != nil {
		o.Restored(index)
	}
}

// OnConfChange implements Observer.
func (o ObserverFuncs) OnConfChange(cc raftpb.ConfChangeV2, cs raftpb.ConfState) {
	if o.ConfChange != nil {
		o.ConfChange(cc, cs)
	}
}
