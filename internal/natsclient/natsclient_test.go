package natsclient

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                           "nats://127.0.0.1:4222",
		"nats://alice:s3cret@127.0.0.1:4222":              "nats://alice:REDACTED@127.0.0.1:4222",
		"nats://tok3n@h:4222":                             "nats://REDACTED@h:4222",
		"nats://a:b@h1:1, tls://c:d@h2:2":                 "nats://a:REDACTED@h1:1,tls://c:REDACTED@h2:2",
		"nats://a:%zz@h:1":                                "nats://REDACTED@h:1", // does not parse
		"a:b@h:1":                                         "REDACTED@h:1",
		"nats://u:p@ss@h:1":                               "nats://u:REDACTED@h:1",
		"nats://127.0.0.1:4222,nats://x:hunter2@h:4222/x": "nats://127.0.0.1:4222,nats://x:REDACTED@h:4222/x",
	} {
		got := Redact(in)
		if got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
		for _, secret := range []string{"s3cret", "tok3n", "hunter2", "%zz", ":p@ss"} {
			if strings.Contains(got, secret) {
				t.Errorf("Redact(%q) = %q still holds %q", in, got, secret)
			}
		}
	}
}

func TestAuthValidate(t *testing.T) {
	for name, a := range map[string]Auth{
		"two methods":      {CredsFile: "c", User: "u"},
		"password no user": {Password: "p"},
		"cert without key": {TLSCert: "c"},
		"wildcard inbox":   {InboxPrefix: "_INBOX.>"},
	} {
		if _, err := a.Options(); !errors.Is(err, ErrAuth) {
			t.Errorf("%s: Options = %v, want ErrAuth", name, err)
		}
	}
	opts, err := Auth{User: "u", Password: "p", TLSCA: "ca.pem", InboxPrefix: "_INBOX.u"}.Options()
	if err != nil || len(opts) != 3 {
		t.Fatalf("Options = %d options, %v", len(opts), err)
	}
}

// The password never comes from a flag: from the file, else the
// environment.
func TestFlagsPassword(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string {
		if k == PasswordEnv {
			return "from-env"
		}
		return ""
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nats-user", "alice"}, "from-env"},
		{[]string{"--nats-user", "alice", "--nats-password-file", pw}, "from-file"},
		{nil, ""}, // no user: the variable is not read
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		build := Flags(fs, env)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		a, err := build()
		if err != nil || a.Password != tc.want {
			t.Errorf("%v: password %q, %v; want %q", tc.args, a.Password, err, tc.want)
		}
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	Flags(fs, env)
	if fs.Lookup("nats-password") != nil {
		t.Fatal("a --nats-password flag would put the secret on argv")
	}
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, nil, 0o600)
	if _, err := ReadSecretFile(empty); err == nil {
		t.Fatal("an empty secret file was accepted")
	}
}
