package natsapi

import (
	"encoding/json"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/transports/protocol"
)

// holderReply is the wire form of a key's holder (list: one per holder).
func holderReply(key string, h lockservice.Holder) protocol.GetReply {
	out := protocol.GetReply{Key: key, Held: h.Held}
	if h.Held {
		x := oneHolder(h)
		out.Token, out.Owner, out.LeaseMS, out.RemainingMS, out.GrantedAtMS, out.Session = x.Token, x.Owner, x.LeaseMS, x.RemainingMS, x.GrantedAtMS, x.Session
		out.Limit, out.Mode = kindFields(h.Lock.Limit, h.Lock.Mode)
	}
	return out
}

// kindFields is a holder's kind as the replies name it: a semaphore slot
// its limit, a shared hold limit 1 (a read/write key's) and mode
// "shared", a mutex or writer neither.
func kindFields(limit uint32, mode core.Mode) (uint32, string) {
	if limit > 1 || mode == core.ModeShared {
		return max(1, limit), protocol.ModeName(mode)
	}
	return 0, ""
}

// getReply is the wire form of a get: the key's holder, or for a
// multi-holder key its kind and every holder.
func getReply(key string, h lockservice.Holder) protocol.GetReply {
	out := holderReply(key, h)
	if h.Limit != 0 {
		out.Limit, out.Mode = h.Limit, protocol.ModeName(h.Mode)
	}
	for _, x := range h.All {
		out.Holders = append(out.Holders, oneHolder(x))
	}
	return out
}

func oneHolder(h lockservice.Holder) protocol.HolderReply {
	out := protocol.HolderReply{Token: h.Lock.Token, Owner: h.Lock.Owner, LeaseMS: int64(h.Lock.LeaseMS),
		RemainingMS: h.Remaining.Milliseconds(), GrantedAtMS: int64(h.Lock.GrantedAtMS)}
	if h.Lock.SessionID != 0 {
		out.Session = protocol.FormatSessionID(h.Lock.SessionID)
	}
	return out
}

// fitHolders encodes a get reply, leaving the last holders out (and
// setting HoldersMore) until it fits in max bytes: a semaphore of
// core.MaxSemaphoreLimit holders with long escaped owners would not fit
// one NATS message. The first holder always fits.
func fitHolders(out protocol.GetReply, max int) ([]byte, error) {
	for {
		body, err := json.Marshal(out)
		if err != nil || len(body) <= max || len(out.Holders) <= 1 {
			return body, err
		}
		out.Holders = out.Holders[:len(out.Holders)*3/4]
		out.HoldersMore = true
	}
}
