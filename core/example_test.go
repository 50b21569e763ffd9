package core_test

import (
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
	// 010702066f726465727302 {Kind:release Key:orders Owner: LeaseMS:0 GrantedAtMS:0 Token:2} <nil>
	// core: malformed: bad varint
}
