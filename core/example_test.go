package core_test

import (
	"crypto/sha256"
	"fmt"

	"github.com/ticketd/ticketd/core"
)

// Apply assigns fencing tokens itself, and a late Expire carrying an old
// token cannot remove the lock issued since.
func ExampleMachine_Apply() {
	m := core.NewMachine()
	for _, c := range []core.Command{
		core.Grant("orders", "client-a", 30_000, 0),
		core.Grant("orders", "client-b", 30_000, 0), // already held
		core.Release("orders", 1),
		core.Grant("orders", "client-b", 30_000, 0),
		core.Expire("orders", 1), // late expiry of the first lock
		core.Grant("invoices", "client-c", 30_000, 0),
		core.Expire("orders", 2),
	} {
		fmt.Printf("%-7s %-8s -> %v\n", c.Kind, c.Key, m.Apply(c))
	}
	fmt.Println("last token:", m.LastToken())
	// Output:
	// grant   orders   -> granted{token:1}
	// grant   orders   -> grant_rejected{token:1}
	// release orders   -> released
	// grant   orders   -> granted{token:2}
	// expire  orders   -> expired{existed:false}
	// grant   invoices -> granted{token:3}
	// expire  orders   -> expired{existed:true}
	// last token: 3
}

// A log entry survives its encoding exactly; the decoder rejects what a
// replica must not apply.
func ExampleDecodeEntry() {
	b := core.EncodeEntry(core.Entry{RequestID: 7, Command: core.Release("orders", 2)})
	e, err := core.DecodeEntry(b)
	fmt.Printf("%x %+v %v\n", b, e.Command, err)

	_, err = core.DecodeEntry(b[:len(b)-1])
	fmt.Println(err)
	// Output:
	// 010702066f726465727302 {Kind:release Key:orders Owner: Identity: RequestID: LeaseMS:0 GrantedAtMS:0 Token:2 SessionID:0 LockDelayMS:0 TTLMS:0 Epoch:0 DelaySeq:0 Limit:0 Mode:exclusive Control:none} <nil>
	// core: malformed: bad varint
}

// Control commands change membership. The credentials themselves never
// enter the log, only their SHA-256; every rejection is a result that
// changes nothing.
func ExampleMachine_Apply_control() {
	bootCred := sha256.Sum256([]byte("bootstrap secret"))
	joinCred := sha256.Sum256([]byte("join secret"))
	m := core.NewMachine()
	for _, c := range []core.Command{
		core.Bootstrap(bootCred, "10.0.0.1:7000"),
		core.Bootstrap(bootCred, "10.0.0.1:7000"), // one-shot
		core.MintJoin(joinCred),
		core.Admit(joinCred, "10.0.0.2:7000"),
		core.Admit(joinCred, "10.0.0.3:7000"), // consumed
		core.Promote(2, 2),
		core.PrepareReplacement(1, "10.0.0.4:7000"),
		core.CompleteReplacement(1, 3, 3),
		core.Promote(1, 1), // retired for good
	} {
		fmt.Printf("%-20s -> %v\n", c.Control.Op, m.Apply(c))
	}
	for _, mem := range m.Members() {
		fmt.Printf("member %d/%d %s %s\n", mem.NodeID, mem.Incarnation, mem.Role, mem.Address)
	}
	fmt.Println(m.CheckIdentity(1, 1))
	// Output:
	// bootstrap            -> bootstrap_recorded{node:1,incarnation:1}
	// bootstrap            -> control_rejected{reason:already_bootstrapped}
	// mint_join            -> control_applied{node:0,incarnation:0}
	// admit                -> admission_accepted{node:2,incarnation:2}
	// admit                -> control_rejected{reason:credential_reused}
	// promote              -> control_applied{node:2,incarnation:2}
	// prepare_replacement  -> replacement_prepared{node:3,incarnation:3}
	// complete_replacement -> control_applied{node:3,incarnation:3}
	// promote              -> control_rejected{reason:node_retired}
	// member 2/2 voter 10.0.0.2:7000
	// member 3/3 voter 10.0.0.4:7000
	// core: node_retired: node 1 was retired
}
